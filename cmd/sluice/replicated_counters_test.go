package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
)

// TestReplicatedRuleCountersOnLeaders: with --cluster-replicas 3, a rule
// counter is counted once, on its shard's leader, whichever node and
// front end a hit comes in by: HIT over RESP, the line protocol and GET
// /check share a rule's counter per actor, and Envoy's ShouldRateLimit counts a
// descriptor's, each sent to every node in turn, and each answers as one
// counter would. After the SIGKILL of a node that leads a shard, the
// counters it led are served by another replica with every hit counted
// (--fsync always): an actor at its limit stays at it. Windows last a
// year, so that none ends in the test.
func TestReplicatedRuleCountersOnLeaders(t *testing.T) {
	dir := t.TempDir()
	const year = "31536000"
	rules := filepath.Join(dir, "rules.ini")
	replaceFile(t, rules, "[path=/api ip=*]\ncreditLimit = 5\nresetSeconds = "+year+"\nactorField = ip\nlabel = api\n\n[default]\ncreditLimit = 0\nresetSeconds = 0\n")
	conf := filepath.Join(dir, "rls")
	if err := os.Mkdir(conf, 0o755); err != nil {
		t.Fatal(err)
	}
	replaceFile(t, filepath.Join(conf, "api.yaml"), "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: year\n      requests_per_unit: 3\n")
	_, _, _, procs := startReplicatedNodes(t, 3, "--fsync", "always", "--policy", rules,
		"--check-addr", "127.0.0.1:0", "--check-trusted-proxies", "127.0.0.1", "--divvy-addr", "127.0.0.1:0", "--rls-addr", "127.0.0.1:0", "--rls-config", conf)
	ctx := context.Background()
	deadline := time.Now().Add(90 * time.Second) // bounds a hang
	waitHomeLeaders(t, procs, deadline)
	clients := make([]*redis.Client, 3)
	rlsc := make([]rlspb.RateLimitServiceClient, 3)
	for i, p := range procs {
		clients[i], rlsc[i] = p.client(t), rlsClient(t, p.rlsAddr)
	}
	lines := make([]*bufio.ReadWriter, 3)
	// hit sends actor's hit to node n by front end fe (0: HIT over RESP,
	// 1: /check, 2: the line protocol), and returns whether it was
	// allowed and what is left; an error (an election under way) when
	// retry, else fatal.
	hit := func(n, fe int, actor string, retry bool) (allowed bool, left int64, err error) {
		t.Helper()
		if fe == 2 {
			if lines[n] == nil {
				c, err := net.DialTimeout("tcp", procs[n].divvyAddr, 30*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				c.SetDeadline(time.Now().Add(2 * time.Minute)) // bounds a hang only
				lines[n] = bufio.NewReadWriter(bufio.NewReader(c), bufio.NewWriter(c))
			}
			lines[n].WriteString("HIT path=/api ip=" + actor + "\n")
			lines[n].Flush()
			reply, err := lines[n].ReadString('\n')
			f := strings.Fields(reply)
			if err == nil && len(f) == 4 && f[0] == "OK" {
				left, _ = strconv.ParseInt(f[2], 10, 64)
				return f[1] == "true", left, nil
			}
			if err == nil {
				err = fmt.Errorf("the line protocol answered %q", reply)
			}
			if !retry {
				t.Fatalf("line HIT of %s on node %d: %v", actor, n, err)
			}
			return false, 0, err
		}
		if fe == 1 {
			cl := http.Client{Timeout: 30 * time.Second}
			req, _ := http.NewRequest("GET", "http://"+procs[n].checkAddr+"/check/api", nil)
			req.Header.Set("X-Forwarded-For", actor)
			res, err := cl.Do(req)
			if err == nil {
				res.Body.Close()
				left, _ = strconv.ParseInt(res.Header.Get("X-RateLimit-Remaining"), 10, 64)
				switch res.StatusCode {
				case http.StatusOK:
					return true, left, nil
				case http.StatusTooManyRequests:
					return false, left, nil
				}
				err = fmt.Errorf("/check answered %d", res.StatusCode)
			}
			if !retry {
				t.Fatalf("/check of %s on node %d: %v", actor, n, err)
			}
			return false, 0, err
		}
		v, err := clients[n].Do(ctx, "HIT", "path=/api", "ip="+actor).Slice()
		if err != nil {
			if !retry {
				t.Fatalf("HIT of %s on node %d: %v", actor, n, err)
			}
			return false, 0, err
		}
		return v[0] == int64(1), v[1].(int64), nil
	}
	rls := func(n int, user string) (rlspb.RateLimitResponse_Code, error) {
		c, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		resp, err := rlsc[n].ShouldRateLimit(c, &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*rlcommon.RateLimitDescriptor{
			{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: user}}},
		}})
		if err != nil {
			return 0, err
		}
		return resp.OverallCode, nil
	}

	const actors = 24 // some in each shard: (2/3)^24 that none is in shard 0
	for a := range actors {
		actor := "10.0.0." + strconv.Itoa(a)
		for k := range 7 {
			n, fe := (a+k)%3, (a+k/3)%3
			allowed, left, _ := hit(n, fe, actor, false)
			if wantAllowed := k < 5; allowed != wantAllowed || (allowed && left != int64(4-k)) {
				t.Fatalf("hit %d of %s on node %d (front end %d): allowed %v, %d left; want allowed %v, %d left", k+1, actor, n, fe, allowed, left, wantAllowed, 4-k)
			}
		}
		user := "u" + strconv.Itoa(a)
		for k := range 4 {
			code, err := rls((a+k)%3, user)
			want := rlspb.RateLimitResponse_OK
			if k >= 3 {
				want = rlspb.RateLimitResponse_OVER_LIMIT
			}
			if err != nil || code != want {
				t.Fatalf("ShouldRateLimit %d of %s on node %d: %v, %v; want %v", k+1, user, (a+k)%3, code, err, want)
			}
		}
	}

	// Each node forwarded the hits of other shards' counters, each to
	// their leader on one connection, all of them answered.
	for i, p := range procs {
		m := scrape(t, p)
		if m[`sluice_cluster_forwarded_hits_total{result="ok"}`] < 1 || m[`sluice_cluster_forwarded_hits_total{result="failed"}`] != 0 ||
			m["sluice_cluster_forward_connections_total"] > 2 || m["sluice_cluster_forward_in_flight"] != 0 {
			t.Errorf("node %d: forwarded hits ok %v, failed %v, on %v connections, %v in flight; want some ok, none failed, at most one connection per other node, none in flight", i,
				m[`sluice_cluster_forwarded_hits_total{result="ok"}`], m[`sluice_cluster_forwarded_hits_total{result="failed"}`], m["sluice_cluster_forward_connections_total"], m["sluice_cluster_forward_in_flight"])
		}
	}

	// Node 0, the leader of shard 0, dies: every counter is served by a
	// replica that has every hit.
	procs[0].stop(t, syscall.SIGKILL)
	for a := range actors {
		actor, user := "10.0.0."+strconv.Itoa(a), "u"+strconv.Itoa(a)
		for n := 1; n < 3; n++ {
			for {
				allowed, _, err := hit(n, (a+n)%2, actor, true)
				if err == nil {
					if allowed {
						t.Fatalf("%s, at its limit before node 0's death, allowed on node %d after it", actor, n)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s on node %d after node 0's death: %v", actor, n, err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			for {
				code, err := rls(n, user)
				if err == nil {
					if code != rlspb.RateLimitResponse_OVER_LIMIT {
						t.Fatalf("%s, at its limit before node 0's death, %v on node %d after it", user, code, n)
					}
					break
				}
				if time.Now().After(deadline) || !strings.Contains(err.Error(), "Unavailable") {
					t.Fatalf("ShouldRateLimit of %s on node %d after node 0's death: %v", user, n, err)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
}
