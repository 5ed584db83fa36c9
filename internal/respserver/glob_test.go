package respserver

import (
	"context"
	"slices"
	"testing"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestConfigGetGlobLikeRedis: globMatch picks, among the names a real
// redis-server has, exactly the ones its CONFIG GET answers for each
// pattern.
func TestConfigGetGlobLikeRedis(t *testing.T) {
	rc := redistest.Start(t)
	ctx := context.Background()
	all, err := rc.ConfigGet(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"*", "max*", "*MAX*", "?ort", "p[aeiou]rt", "p[^a]rt", "[a-c]*", "[c-a]*", "*-*-*-*", "tls-*-file",
		"[", "[abc", "*[", "*[]", "[]*", "a*b*c", "*e", "**e**", "\\m*", "*\\-*", "[\\]]*", "[a-]*", "???", "*y?", "h[a-z]*z",
		"client-*-limit", "*-limit*", "*max*mem*", "[^a-m]*", "latency*", "*a*a*a*a*a*a*a*a*a*a*a*a*b"} {
		reply, err := rc.ConfigGet(ctx, p).Result()
		if err != nil {
			t.Fatalf("redis-server CONFIG GET %q: %v", p, err)
		}
		var want, got []string
		for name := range reply {
			want = append(want, name)
		}
		for name := range all {
			if globMatch(p, name) {
				got = append(got, name)
			}
		}
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("pattern %q: globMatch picks %v, redis-server %v", p, got, want)
		}
	}
}
