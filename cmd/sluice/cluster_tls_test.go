package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// TestClusterForwardOverTLS: two nodes serving RESP, HTTP and Envoy's
// rate limit service over TLS with client certificates (--tls-ca). A
// HIT and a GET /check sent to the node that does not own the actor's
// counter are forwarded to its owner over TLS and counted there, as are
// Envoy's calls sent to either node and the line protocol's HIT; a node with --tls-cert and no
// --tls-ca cannot verify the owner and answers an error naming --tls-ca.
func TestClusterForwardOverTLS(t *testing.T) {
	cert, key := writeCA(t, filepath.Join(t.TempDir(), "ca"))
	rules, o := overrideCluster(t)
	conf := overrideRLSConfig(t, rules)
	addrs := freePorts(t, 2)
	procs := startCluster(t, addrs, "--policy", rules, "--check-addr", "127.0.0.1:0", "--check-trusted-proxies", "127.0.0.1",
		"--rls-addr", "127.0.0.1:0", "--rls-config", conf, "--divvy-addr", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", key, "--tls-ca", cert)
	tc := clientCert(t, cert, key)
	ctx := context.Background()
	resp := func(p *proc) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: p.addr, TLSConfig: tc, MaxRetries: -1, ReadTimeout: time.Minute, WriteTimeout: time.Minute})
		t.Cleanup(func() { c.Close() })
		return c
	}
	hit := func(n int, actor string, wantAllowed int64) {
		t.Helper()
		v, err := resp(procs[n]).Do(ctx, "HIT", "path=/api", "ip="+actor).Slice()
		if err != nil {
			t.Fatalf("HIT of %s on node %d: %v", actor, n, err)
		}
		if v[0] != wantAllowed {
			t.Fatalf("HIT of %s on node %d: %v; want allowed %d", actor, n, v, wantAllowed)
		}
	}
	hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: tc}}
	check := func(n int, actor string, code int) {
		t.Helper()
		req, err := http.NewRequest("GET", "https://"+procs[n].checkAddr+"/check/api", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Forwarded-For", actor)
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != code {
			t.Fatalf("/check of %s on node %d: %d; want %d", actor, n, res.StatusCode, code)
		}
	}

	// Node 1 owns slots 8192-16383; the rule allows 2 hits a year.
	a := o.actorOn("10.0.1.", 8192, 16383)
	hit(0, a, 1)
	check(0, a, http.StatusOK)
	hit(0, a, 0)
	check(0, a, http.StatusTooManyRequests)
	hit(1, a, 0) // counted on the owner
	// The line protocol (plain TCP: divvy's clients speak no TLS).
	b := o.actorOn("10.0.2.", 8192, 16383)
	dc, err := net.Dial("tcp", procs[0].divvyAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	dc.SetDeadline(time.Now().Add(time.Minute)) // bounds a hang only
	dr := bufio.NewReader(dc)
	for k, want := range []string{"OK true 1 ", "OK true 0 "} {
		fmt.Fprintf(dc, "HIT path=/api ip=%s\n", b)
		if line, err := dr.ReadString('\n'); err != nil || !strings.HasPrefix(line, want) {
			t.Fatalf("divvy HIT %d of %s on node 0: %q, %v; want %q...", k+1, b, line, err, want)
		}
	}
	hit(1, b, 0)
	if n, err := resp(procs[0]).DBSize(ctx).Result(); err != nil || n != 0 {
		t.Errorf("DBSIZE on node 0, which owns no counter hit: %d, %v; want 0", n, err)
	}

	// Envoy's descriptor user=u (3 a year), called on each node in turn:
	// half the calls are forwarded, whichever node owns it.
	for k := range 4 {
		cc, err := grpc.NewClient(procs[k%2].rlsAddr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
		if err != nil {
			t.Fatal(err)
		}
		st := shouldRateLimit(t, rlspb.NewRateLimitServiceClient(cc), "u")
		cc.Close()
		want := rlspb.RateLimitResponse_OK
		if k == 3 {
			want = rlspb.RateLimitResponse_OVER_LIMIT
		}
		if st.Code != want {
			t.Fatalf("call %d of user=u on node %d: %v; want %v", k+1, k%2, st.Code, want)
		}
	}

	// Without --tls-ca a node has nothing to verify its peers with.
	addrs = freePorts(t, 2)
	procs = startCluster(t, addrs, "--policy", rules, "--tls-cert", cert, "--tls-key", key)
	err = resp(procs[0]).Do(ctx, "HIT", "path=/api", "ip="+a).Err()
	if err == nil || !strings.Contains(err.Error(), "to its owner "+addrs[1]+" failed: ") || !strings.Contains(err.Error(), "--tls-ca") {
		t.Fatalf("HIT forwarded over TLS without --tls-ca: %v; want an error naming the owner and --tls-ca", err)
	}
}

// clientCert is the TLS configuration of a client of nodes whose
// certificate and CA is cert: it presents cert and verifies theirs.
func clientCert(t *testing.T, cert, key string) *tls.Config {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(cert)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, MinVersion: tls.VersionTLS12}
}
