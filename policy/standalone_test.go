package policy

import (
	"bytes"
	"testing"
)

// TestStandaloneIdentityIsNeverARuleFiles: a front end's rule (Envoy's
// rate limit service) and a rule file's rule with the same operation,
// numbers, algorithm and actor field get different counter identities, so
// a HIT matching the rule file's rule cannot reach the front end's
// counter; two front ends' identical rules differ too, and Standalone
// still gives identical rules of one front end distinct identities.
func TestStandaloneIdentityIsNeverARuleFiles(t *testing.T) {
	file, err := ParseINI("p.ini", []byte("[domain=d descriptor=*]\nalgorithm = fixedWindow\ncreditLimit = 2\nresetSeconds = 3600\nactorField = descriptor\n\n[default]\ncreditLimit = 100\nresetSeconds = 60\n"))
	if err != nil {
		t.Fatal(err)
	}
	rule := Rule{Operation: []Pair{{Key: "domain", Value: "d"}, {Key: "descriptor", Value: "*"}}, Algorithm: FixedWindow,
		CreditLimit: 2, ResetSeconds: 3600, ActorField: "descriptor"}
	rls := Standalone("rls", []Rule{rule, rule})
	other := Standalone("other", []Rule{rule})
	q := req("domain", "d", "descriptor", "v")
	fromFile := file.Rules()[0].AppendCounterID(nil, q)
	ids := [][]byte{fromFile, rls[0].AppendCounterID(nil, q), rls[1].AppendCounterID(nil, q), other[0].AppendCounterID(nil, q)}
	names := []string{"the rule file's", "rls rule 1", "rls rule 2 (identical)", "another front end's"}
	for i := range ids {
		for j := i + 1; j < len(ids); j++ {
			if bytes.Equal(ids[i], ids[j]) {
				t.Errorf("%s and %s counter identities are the same: %x", names[i], names[j], ids[i])
			}
		}
	}
	// The identity stays a function of the content: loading again gives
	// the same counters.
	if again := Standalone("rls", []Rule{rule}); !bytes.Equal(again[0].AppendCounterID(nil, q), ids[1]) {
		t.Errorf("Standalone's identity changed between two loads of the same rule")
	}
}
