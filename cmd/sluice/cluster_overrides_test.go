package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/policy"
)

// overrideRules is a slidingLog rule of 2 hits a year per ip, labelled
// api: its counters count hits, so a changed limit applies at once
// whichever way, and no window ends in a test.
const overrideRules = "[path=/api ip=*]\nalgorithm = slidingLog\ncreditLimit = 2\nresetSeconds = 31536000\nactorField = ip\nlabel = api\n\n[default]\ncreditLimit = 0\nresetSeconds = 0\n"

// overrideNodes drives per-actor overrides on the nodes of a cluster:
// each node keeps its own, so every change is sent to each.
type overrideNodes struct {
	t     *testing.T
	procs []*proc
	rules *policy.Policy
}

// slot is the hash slot of actor's counter of the api rule.
func (o overrideNodes) slot(actor string) uint16 {
	req := policy.Request{{Key: []byte("path"), Value: []byte("/api")}, {Key: []byte("ip"), Value: []byte(actor)}}
	r, _ := o.rules.Match(req, nil)
	s, _ := keyspace.RecordSlot(keyspace.AppendRuleKey(nil, r, r.CreditLimit, r.AppendCounterID(nil, req)))
	return s
}

// set sends POLICY OVERRIDE api actor op (a limit, or RESET) to every
// node, the first over HTTP (/v1/policy/), and fails unless each takes it.
func (o overrideNodes) set(actor, op string) {
	o.t.Helper()
	for i, p := range o.procs {
		if p == nil {
			continue
		}
		if i == 0 {
			method, body := "PUT", `{"limit": `+op+`}`
			if op == "RESET" {
				method, body = "DELETE", ""
			}
			req, err := http.NewRequest(method, "http://"+p.httpAddr+"/v1/policy/overrides/api/"+actor, strings.NewReader(body))
			if err != nil {
				o.t.Fatal(err)
			}
			res, err := (&http.Client{Timeout: time.Minute}).Do(req)
			if err != nil {
				o.t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != http.StatusOK {
				o.t.Fatalf("%s /v1/policy/overrides/api/%s on node 0: %d", method, actor, res.StatusCode)
			}
			continue
		}
		v, err := p.client(o.t).Do(context.Background(), "POLICY", "OVERRIDE", "api", actor, op).Result()
		if err != nil {
			o.t.Fatalf("POLICY OVERRIDE api %s %s on node %d: %v", actor, op, i, err)
		}
		if want := map[bool]string{true: "1", false: "OK"}[op == "RESET"]; fmt.Sprint(v) != want {
			o.t.Fatalf("POLICY OVERRIDE api %s %s on node %d: %v; want %s", actor, op, i, v, want)
		}
	}
}

// hit sends actor's HIT to node n and returns whether it was allowed
// and what is left; an error (a shard's election under way) when retry,
// else fatal.
func (o overrideNodes) hit(n int, actor string, retry bool) (allowed bool, left int64, err error) {
	o.t.Helper()
	v, err := o.procs[n].client(o.t).Do(context.Background(), "HIT", "path=/api", "ip="+actor).Slice()
	if err != nil {
		if !retry {
			o.t.Fatalf("HIT of %s on node %d: %v", actor, n, err)
		}
		return false, 0, err
	}
	return v[0] == int64(1), v[1].(int64), nil
}

// wantHits fails unless actor's next hits on node n are allowed with the
// credits left in lefts (-1: denied).
func (o overrideNodes) wantHits(n int, actor string, lefts ...int64) {
	o.t.Helper()
	o.wantHitsBy(time.Time{}, n, actor, lefts...)
}

// wantHitsBy is wantHits retrying a hit that gets an error (a shard not
// served yet, an election) until deadline; a zero deadline retries none.
func (o overrideNodes) wantHitsBy(deadline time.Time, n int, actor string, lefts ...int64) {
	o.t.Helper()
	for k, want := range lefts {
		allowed, left, err := o.hit(n, actor, !deadline.IsZero())
		for err != nil {
			if time.Now().After(deadline) {
				o.t.Fatalf("hit %d of %s on node %d: %v", k+1, actor, n, err)
			}
			time.Sleep(20 * time.Millisecond)
			allowed, left, err = o.hit(n, actor, true)
		}
		if allowed != (want >= 0) || (allowed && left != want) {
			o.t.Fatalf("hit %d of %s on node %d: allowed %v, %d left; want %v", k+1, actor, n, allowed, left, want)
		}
	}
}

// check sends actor's GET /check to node n (the actor is X-Forwarded-For,
// from a trusted proxy) and fails unless it answers code with the
// limit in force, in X-RateLimit-Limit and RateLimit-Policy (its q, the
// rate: the node reports the owner's).
func (o overrideNodes) check(n int, actor string, code int, limit string) {
	o.t.Helper()
	req, err := http.NewRequest("GET", "http://"+o.procs[n].checkAddr+"/check/api", nil)
	if err != nil {
		o.t.Fatal(err)
	}
	req.Header.Set("X-Forwarded-For", actor)
	res, err := (&http.Client{Timeout: time.Minute}).Do(req)
	if err != nil {
		o.t.Fatal(err)
	}
	res.Body.Close()
	h := res.Header
	if res.StatusCode != code || h.Get("X-RateLimit-Limit") != limit || !strings.Contains(h.Get("RateLimit-Policy"), ";q="+limit+";") {
		o.t.Fatalf("/check of %s on node %d: %d, X-RateLimit-Limit %q, RateLimit-Policy %q; want %d, limit %s", actor, n, res.StatusCode, h.Get("X-RateLimit-Limit"), h.Get("RateLimit-Policy"), code, limit)
	}
}

// actorOn returns an actor whose counter's slot is in [lo, hi].
func (o overrideNodes) actorOn(prefix string, lo, hi int) string {
	for i := 0; ; i++ {
		a := prefix + strconv.Itoa(i)
		if s := int(o.slot(a)); s >= lo && s <= hi {
			return a
		}
	}
}

// overrideRLSConfig writes, next to the rule file rules, an RLS
// configuration directory whose domain api limits each user to 3 a year
// (sliding_log), and returns it.
func overrideRLSConfig(t *testing.T, rules string) string {
	t.Helper()
	conf := filepath.Join(filepath.Dir(rules), "rls")
	if err := os.Mkdir(conf, 0o755); err != nil {
		t.Fatal(err)
	}
	replaceFile(t, filepath.Join(conf, "api.yaml"), "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      algorithm: sliding_log\n      unit: year\n      requests_per_unit: 3\n")
	return conf
}

func overrideCluster(t *testing.T) (string, overrideNodes) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.ini")
	replaceFile(t, rules, overrideRules)
	p, err := policy.Load(rules, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return rules, overrideNodes{t: t, rules: p}
}

// TestClusterOverrides (issue 30, overrides in cluster mode): two nodes,
// each sent every change. A per-actor override decides a HIT that arrives
// on the node that does not own the actor's counter (the owner reads it),
// and /check on that node reports the owner's limit in force, as Envoy's
// rate limit service does for an RLS.OVERRIDE (current_limit); after the
// counter's slot moves to the other node (sluice cluster move), a hit on
// the node it left is decided under the override of its new owner, a
// changed override applies there at once, and RESET returns the actor to
// the rule's limit.
func TestClusterOverrides(t *testing.T) {
	rules, o := overrideCluster(t)
	conf := overrideRLSConfig(t, rules)
	addrs := freePorts(t, 2)
	o.procs = startCluster(t, addrs, "--policy", rules, "--check-addr", "127.0.0.1:0", "--check-trusted-proxies", "127.0.0.1", "--check-header-style", "both",
		"--rls-addr", "127.0.0.1:0", "--rls-config", conf)
	// Node 1 owns slots 8192-16383 at first.
	a, b := o.actorOn("10.0.1.", 8192, 16383), o.actorOn("10.0.2.", 8192, 16383)
	o.set(a, "4")
	o.set(b, "3")
	o.wantHits(0, a, 3, 2, 1, 0, -1) // the rule's limit would deny the third
	o.check(0, b, http.StatusOK, "3")
	o.wantHits(0, "10.0.3.1", 1, 0, -1) // no override: the rule's 2

	// Envoy's descriptor user=u, overridden to 5 on both nodes, called on
	// each in turn: half the calls are forwarded, whichever node owns it.
	for i, p := range o.procs {
		if err := p.client(t).Do(context.Background(), "RLS.OVERRIDE", "api", "user=u", "5").Err(); err != nil {
			t.Fatalf("RLS.OVERRIDE on node %d: %v", i, err)
		}
	}
	for k := range 6 {
		st := shouldRateLimit(t, rlsClient(t, o.procs[k%2].rlsAddr), "u")
		want := rlspb.RateLimitResponse_OK
		if k == 5 {
			want = rlspb.RateLimitResponse_OVER_LIMIT
		}
		if st.Code != want || st.CurrentLimit.GetRequestsPerUnit() != 5 {
			t.Fatalf("call %d of user=u on node %d: %v, current_limit %d; want %v, 5", k+1, k%2, st.Code, st.CurrentLimit.GetRequestsPerUnit(), want)
		}
	}

	// The move of a's slot to node 0, the node a's hits came to.
	var out bytes.Buffer
	s := strconv.Itoa(int(o.slot(a)))
	if err := runReloading(context.Background(), nil, []string{"cluster", "move", "--nodes", strings.Join(addrs, ","), "--slots", s, "--to", addrs[0]}, noEnvLookup, nil, &out, &out); err != nil {
		t.Fatalf("moving slot %s to node 0: %v\n%s", s, err, out.String())
	}
	o.wantHits(1, a, -1) // 4 used, its override 4: on node 0 now
	o.set(a, "6")
	o.wantHits(1, a, 1, 0, -1)
	o.set(a, "RESET")
	o.wantHits(1, a, -1)
	o.wantHits(0, a, -1)
	for i, p := range o.procs {
		if got := fmt.Sprint(p.client(t).Do(context.Background(), "POLICY", "OVERRIDES", "api").Val()); got != "[0 ["+b+" 3]]" {
			t.Errorf("POLICY OVERRIDES api on node %d: %s; want only %s's", i, got, b)
		}
	}
	o.check(1, a, http.StatusTooManyRequests, "2")
}

// TestReplicatedOverrides: with --cluster-replicas 3, an override
// decides a hit sent to a node that does not lead the counter's shard,
// and still does after the SIGKILL of that shard's leader, on the replica
// that leads it then (--fsync always: every hit counted is kept).
func TestReplicatedOverrides(t *testing.T) {
	rules, o := overrideCluster(t)
	_, _, _, o.procs = startReplicatedNodes(t, 3, "--fsync", "always", "--policy", rules)
	deadline := time.Now().Add(90 * time.Second) // bounds a hang
	waitHomeLeaders(t, o.procs, deadline)
	// Shard 2, led by node 2 at first, has slots 10923-16383.
	a := o.actorOn("10.0.1.", 10923, 16383)
	o.set(a, "4")
	o.wantHitsBy(deadline, 0, a, 3, 2)
	o.procs[2].stop(t, syscall.SIGKILL)
	o.procs[2] = nil
	// Served again by node 0 or 1 after an election, under its override.
	o.wantHitsBy(deadline, 0, a, 1)
	o.wantHitsBy(deadline, 1, a, 0, -1)
	o.set(a, "RESET")
	if err := o.procs[0].client(t).Do(context.Background(), "POLICY", "OVERRIDE", "api", a).Err(); err != redis.Nil {
		t.Fatalf("POLICY OVERRIDE api %s after RESET: %v; want nil", a, err)
	}
}
