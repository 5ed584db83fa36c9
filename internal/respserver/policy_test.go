package respserver

import (
	"errors"
	"fmt"
	"testing"

	"github.com/sluicehq/sluice/internal/reload"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/storage"
)

// TestReloadReply: POLICY RELOAD's answer to what the server's reload
// found: a bad file named, on one line, with what is kept (the policy
// file's first when both are bad); no policy file, the error every rule
// front end gives; a reload past --reload-timeout said as such; anything
// else rendered as every command's error.
func TestReloadReply(t *testing.T) {
	bad := errors.New("policy: rules.ini:2: creditLimit is x;\nexpected an integer")
	badRLS := errors.New("rls: a.yaml: YAML: line 2")
	for _, tc := range []struct {
		name string
		err  error
		want string // ErrorText of the reply; "" for OK
	}{
		{"ok", nil, ""},
		{"bad policy", &ReloadError{Policy: bad}, "ERR policy: rules.ini:2: creditLimit is x; expected an integer; the rules in use are kept"},
		{"bad rls", &ReloadError{RLS: badRLS}, "ERR --rls-config: rls: a.yaml: YAML: line 2; the configuration in use is kept"},
		{"both bad", &ReloadError{Policy: bad, RLS: badRLS}, "ERR policy: rules.ini:2: creditLimit is x; expected an integer; the rules in use are kept"},
		{"no policy", &ReloadError{Policy: rules.ErrNoPolicy}, "ERR " + rules.ErrNoPolicy.Error()},
		{"timeout", fmt.Errorf("%w: still reading its files\nafter 5s", reload.ErrTimeout), "ERR server: reload timed out: still reading its files after 5s"},
		{"closing", storage.ErrClosed, ErrorText(storage.ErrClosed, &testHost{})},
	} {
		err := reloadReply(tc.err)
		got := ""
		if err != nil {
			got = ErrorText(err, &testHost{})
		}
		if got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
