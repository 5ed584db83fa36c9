package policy

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/sluicehq/sluice/internal/conffile"
)

// MatchPolicy says what happens after a rule matches.
type MatchPolicy uint8

const (
	// Stop: the rule decides the reply. It is the default.
	Stop MatchPolicy = iota
	// Canary: the rule's counter is consumed and its outcome counted in
	// metrics, then matching goes on to the next rule.
	Canary
)

// String returns the name used in rule files.
func (m MatchPolicy) String() string {
	switch m {
	case Stop:
		return "stop"
	case Canary:
		return "canary"
	}
	return fmt.Sprintf("MatchPolicy(%d)", uint8(m))
}

// parseMatchPolicy reads a rule file's matchPolicy; empty means the default.
func parseMatchPolicy(s string) (MatchPolicy, string) {
	switch s {
	case "", "stop":
		return Stop, ""
	case "canary":
		return Canary, ""
	}
	return Stop, fmt.Sprintf("matchPolicy is %q; expected stop or canary", s)
}

// Pair is one key and value of a rule's operation.
type Pair struct {
	Key, Value string
}

// Rule is one rule of a policy. Its fields are read-only: a Policy shares
// its rules between goroutines.
type Rule struct {
	// Operation lists the keys a request must have and the values they must
	// match, in the order the file gives them. The default rule's is empty.
	Operation    []Pair
	CreditLimit  int64 // allowed hits per window; 0 denies every hit
	ResetSeconds int64 // window length; 0 (with CreditLimit > 0) allows every hit
	// Algorithm is how hits are counted; Divvy when the file gives none.
	Algorithm    Algorithm
	Stagger      bool  // FixedWindow: shift the windows by a per-counter offset
	Burst        int64 // GCRA, TokenBucket: most hits at once; 0 means the limit
	MinGapMillis int64 // SlidingLog: least time between two hits; 0 for none
	// QuotaField names the request field whose value, capped at MaxQuota,
	// replaces CreditLimit for that hit; "" for none. See Rule.Limit.
	QuotaField  string
	MaxQuota    int64
	ActorField  string
	MatchPolicy MatchPolicy
	Label       string // "" when the file gives none
	Comment     string
	// OverrideLabel is what a front end's rule (Standalone) keeps its
	// per-actor overrides under, "" for none; a rule file's rule keeps
	// them under Label (see OverridesLabel).
	OverrideLabel string

	// Shadow counts the rule's hits and reports what the limit decided,
	// but never refuses one (envoyproxy/ratelimit's shadow_mode): a new
	// limit is tried on real traffic before it is enforced.
	Shadow bool

	Pos  int    // position in the file, counting from 1 as error messages do
	File string // the name the policy was loaded under
	Line int    // line of the rule's header (INI) or opening brace (JSON); 0 if unknown

	conds []cond
	id    [idLen]byte // counter identity, see AppendCounterID
	// standalone is a front end's rule (Standalone), not a rule file's.
	standalone bool
	// file is the rule file's rule a runtime limit was made from
	// (WithLimit); nil for the file's own.
	file *Rule
}

// String returns the rule's operation as an INI header, e.g.
// `[method=GET path=/status]` or `[default]`.
func (r *Rule) String() string { return formatHeader(r.Operation) }

// Standalone reports whether r is a front end's rule (Standalone's), not
// a rule file's.
func (r *Rule) Standalone() bool { return r.standalone }

// OverridesLabel is the label r's per-actor overrides are kept under:
// Label for a rule file's rule, OverrideLabel for a front end's, whose
// Label (Envoy's rate_limit name) is not unique.
func (r *Rule) OverridesLabel() string {
	if r.standalone {
		return r.OverrideLabel
	}
	return r.Label
}

// Counted reports whether hits on r under its own CreditLimit use a
// counter. Always-deny (CreditLimit 0) and always-allow (ResetSeconds 0)
// rules do not, so a server can skip the store for them. With a quota, see
// MayCount.
func (r *Rule) Counted() bool { return r.CreditLimit > 0 && r.ResetSeconds > 0 }

// Policy is a validated, ordered list of rules whose last rule is the
// default. It is immutable and safe for concurrent use.
type Policy struct {
	file  string
	rules []Rule
}

// File returns the name the policy was loaded under.
func (p *Policy) File() string { return p.file }

// Rules returns the rules in file order, the default last.
func (p *Policy) Rules() []*Rule {
	out := make([]*Rule, len(p.rules))
	for i := range p.rules {
		out[i] = &p.rules[i]
	}
	return out
}

// Load reads a rule file, choosing the format by its extension: .ini or
// .json, in any letter case. The file must be a regular file (or a
// symlink to one) of at most maxBytes (0 or less: conffile.DefaultLimit).
func Load(path string, maxBytes int64) (*Policy, error) {
	var parse func(string, []byte) (*Policy, error)
	switch strings.ToLower(filepath.Ext(path)) {
	case ".ini":
		parse = ParseINI
	case ".json":
		parse = ParseJSON
	default:
		return nil, &ValidationError{File: path, Problem: "unknown rule file format; expected a .ini or .json file"}
	}
	data, err := conffile.Read(path, maxBytes)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	return parse(path, data)
}

// ValidationError is a rule file that cannot be used. It names the first
// problem found, in file order; the whole file is rejected.
type ValidationError struct {
	File    string
	Line    int    // 1-based; 0 when unknown or not about one line
	Rule    string // e.g. `rule 3 [method=GET path=/x]`; "" for the whole file
	Problem string
}

// Error returns "policy: file:line: rule: problem", leaving out the parts
// that are unknown.
func (e *ValidationError) Error() string {
	var b strings.Builder
	b.WriteString("policy: ")
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	if e.Rule != "" {
		b.WriteString(": ")
		b.WriteString(e.Rule)
	}
	b.WriteString(": ")
	b.WriteString(e.Problem)
	return b.String()
}

// describe names a rule in error messages.
func describe(pos int, op []Pair) string {
	return fmt.Sprintf("rule %d %s", pos, formatHeader(op))
}

func (r *Rule) fail(line int, format string, args ...any) *ValidationError {
	if line == 0 {
		line = r.Line
	}
	return &ValidationError{File: r.File, Line: line, Rule: describe(r.Pos, r.Operation), Problem: fmt.Sprintf(format, args...)}
}

// newPolicy validates rules, as parsed from file, and compiles them. The
// loaders have already checked what one rule can say about itself
// (integers, matchPolicy, labels, duplicate keys); newPolicy checks the rest.
func newPolicy(file string, rules []Rule) (*Policy, error) {
	if len(rules) == 0 {
		return nil, &ValidationError{File: file, Problem: "no rules; a rule file needs at least a default rule ([default] or \"default\")"}
	}
	p := &Policy{file: file, rules: slices.Clone(rules)}
	labels := make(map[string]int)
	ids := make(map[string]int)
	last := len(p.rules) - 1
	for i := range p.rules {
		r := &p.rules[i]
		r.Pos, r.File = i+1, file
		r.conds = compile(r.Operation)
		r.id = identity(r, ids, "")
		if r.Label != "" {
			if j, dup := labels[r.Label]; dup {
				return nil, r.fail(0, "label %q is already used by rule %d; labels must be unique", r.Label, j)
			}
			labels[r.Label] = r.Pos
		}
		if len(r.Operation) == 0 && r.MatchPolicy == Stop && i != last {
			return nil, r.fail(0, "the default rule (empty operation) must be the last rule; %d rule(s) follow it", last-i)
		}
		for j := range p.rules[:i] {
			if e := &p.rules[j]; e.MatchPolicy == Stop && e.covers(r) {
				return nil, r.fail(0, "unreachable: %s (line %d) matches every request this rule matches", describe(e.Pos, e.Operation), e.Line)
			}
		}
	}
	d := &p.rules[last]
	if len(d.Operation) != 0 {
		return nil, d.fail(0, "no default rule: the last rule must have an empty operation ([default])")
	}
	if d.MatchPolicy != Stop {
		return nil, d.fail(0, "the default rule must have matchPolicy stop, so that every request gets a reply")
	}
	return p, nil
}

// validLabel is ^[a-zA-Z0-9_-]{1,255}$, by hand to keep regexp out of the
// package.
func validLabel(s string) bool {
	if len(s) < 1 || len(s) > 255 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// covers reports whether e matches every request that r matches: every key
// of e is a key of r, and e's value matches r's value read as plain text.
//
// Reading r's glob as text is sound: e's literal runs hold no `*`, so each
// `*` of r's value falls inside a `*` of e, which absorbs whatever r's `*`
// stands for. It is also complete unless e's value uses all 256 byte values
// (then a run of some byte e lacks, put for r's stars, would show a value r
// matches and e does not). An exact value never covers a glob: it has no `*`.
func (e *Rule) covers(r *Rule) bool {
	for i := range e.conds {
		c := &e.conds[i]
		j := slices.IndexFunc(r.Operation, func(p Pair) bool { return p.Key == c.key })
		if j < 0 || !c.matchValue([]byte(r.Operation[j].Value)) {
			return false
		}
	}
	return true
}

const idLen = CounterIDLen

// CounterIDLen is the length of the rule identity that starts every
// counter identity (AppendCounterID).
const CounterIDLen = 8

// identity computes the counter identity of r: a hash of what the counter
// means (the operation as a set, the limits and the actor field) and of how
// many earlier rules of the file have the same content, so that two identical
// canary rules do not share a counter. Label, comment, matchPolicy and
// position are left out: editing them, or moving the rule, keeps its counters.
//
// source is "" for a rule file's rules, and names the front end of
// Standalone's rules ("rls"). Those hash from a different start, so that
// no rule file can ever give a rule the identity, and so the counters, of
// a front end's rule with the same operation and numbers (or the other
// way round), whatever the request's fields.
func identity(r *Rule, seen map[string]int, source string) [idLen]byte {
	op := slices.Clone(r.Operation)
	slices.SortFunc(op, func(a, b Pair) int { return cmp.Compare(a.Key, b.Key) })
	b := []byte("sluice policy counter v1\x00")
	str := func(s string) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	if source != "" {
		b = append(b[:0], "sluice standalone counter v1\x00"...)
		str(source)
	}
	b = binary.AppendUvarint(b, uint64(len(op)))
	for _, p := range op {
		str(p.Key)
		str(p.Value)
	}
	b = binary.AppendVarint(b, r.CreditLimit)
	b = binary.AppendVarint(b, r.ResetSeconds)
	str(r.ActorField)
	// Divvy rules without a quota hash as before these fields existed, so
	// their counters survive an upgrade.
	if r.Algorithm != Divvy || r.QuotaField != "" {
		b = append(b, "\x00v2"...)
		b = append(b, byte(r.Algorithm))
		if r.Stagger {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
		b = binary.AppendVarint(b, r.Burst)
		b = binary.AppendVarint(b, r.MinGapMillis)
		str(r.QuotaField)
		b = binary.AppendVarint(b, r.MaxQuota)
	}
	n := seen[string(b)]
	seen[string(b)] = n + 1
	b = binary.AppendUvarint(b, uint64(n))
	sum := sha256.Sum256(b)
	return [idLen]byte(sum[:idLen])
}

// formatHeader renders an operation as an INI header, quoting what needs it.
func formatHeader(op []Pair) string {
	if len(op) == 0 {
		return "[default]"
	}
	var b strings.Builder
	b.WriteByte('[')
	for i, p := range op {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(quoteINI(p.Key))
		b.WriteByte('=')
		b.WriteString(quoteINI(p.Value))
	}
	b.WriteByte(']')
	return b.String()
}

// quoteINI quotes s when the INI header syntax needs it. A string holding
// both quote characters cannot be written in a header; it is shown with
// double quotes anyway, as this is only for messages.
func quoteINI(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t=\"']") {
		return s
	}
	if strings.Contains(s, `"`) && !strings.Contains(s, "'") {
		return "'" + s + "'"
	}
	return `"` + s + `"`
}
