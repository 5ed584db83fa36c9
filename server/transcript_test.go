package server

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/divvy"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/transcript"
)

var rewrite = flag.Bool("rewrite", false, "write the replies the transcript tests get into testdata/transcripts")

// transcriptDir holds the transcripts of every front end (package
// transcript): a request, then the exact reply.
var transcriptDir = filepath.Join("testdata", "transcripts")

// transcriptTime is the server clock of the transcripts, unix ms: the
// time of a request without AT.
const transcriptTime = 1_700_000_000_000

// TestRESPTranscripts replays resp/*.txt, each file on a connection of its
// own, in the order of their names, on one standalone server with
// --max-key-size 16: the RESP2 and RESP3 sessions of
// cmd/sluice/testdata/transcript-resp*.txt, byte for byte and without
// redis-cli, then every error a client can meet.
func TestRESPTranscripts(t *testing.T) {
	srv := startServer(t, Config{Engine: engine.Tuning{MaxKeySize: 16}, Clock: newTestClock(transcriptTime).now})
	files, err := filepath.Glob(filepath.Join(transcriptDir, "resp", "[0-9]-*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no RESP transcripts: %v", err)
	}
	sort.Strings(files)
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) { runRESPTranscript(t, srv, f) })
	}
}

// TestRuleTranscripts replays the transcripts of the rule front ends, HIT
// over RESP, the divvy line protocol and GET /check, on one server with
// the rules of policy.ini, in that order.
func TestRuleTranscripts(t *testing.T) {
	srv := startServer(t, Config{
		Engine: engine.Tuning{MaxKeySize: 16},
		Clock:  newTestClock(transcriptTime).now,
		Policy: policycmd.Config{File: filepath.Join(transcriptDir, "policy.ini")},
		Divvy:  divvy.Config{MaxLine: 100},
	})
	divvy := startDivvy(t, srv)
	check := startCheck(t, srv)
	t.Run("resp/policy.txt", func(t *testing.T) { runRESPTranscript(t, srv, filepath.Join(transcriptDir, "resp", "policy.txt")) })
	t.Run("line.txt", func(t *testing.T) {
		transcript.Run(t, filepath.Join(transcriptDir, "line.txt"), *rewrite, func(req string) string {
			return lineRequest(t, divvy, req)
		})
	})
	t.Run("check.txt", func(t *testing.T) {
		transcript.Run(t, filepath.Join(transcriptDir, "check.txt"), *rewrite, func(req string) string {
			return checkRequest(t, check, req)
		})
	})
}

// runRESPTranscript sends each request of file, a command line whose
// words are split on spaces ("..." holds spaces), as a RESP array on one
// connection, and reads one whole reply.
func runRESPTranscript(t *testing.T, srv *Server, file string) {
	c := dialRaw(t, srv)
	r := bufio.NewReader(c.conn)
	transcript.Run(t, file, *rewrite, func(req string) string {
		c.write(respCommand(commandWords(req)...))
		b, err := readRESPReply(r)
		if err != nil {
			t.Fatalf("> %s: %v after %q", req, err, b)
		}
		return string(b)
	})
}

// commandWords splits a command line on spaces, with "..." for a word
// holding spaces.
func commandWords(line string) [][]byte {
	var out [][]byte
	for line = strings.TrimSpace(line); line != ""; line = strings.TrimSpace(line) {
		if line[0] == '"' {
			end := strings.IndexByte(line[1:], '"') + 1
			out = append(out, []byte(line[1:end]))
			line = line[end+1:]
			continue
		}
		w, rest, _ := strings.Cut(line, " ")
		out = append(out, []byte(w))
		line = rest
	}
	return out
}

// readRESPReply reads one whole RESP2 or RESP3 reply, as its bytes.
func readRESPReply(r *bufio.Reader) ([]byte, error) {
	line, err := r.ReadBytes('\n')
	if err != nil {
		return line, err
	}
	out := line
	n, _ := strconv.Atoi(strings.TrimRight(string(line[1:]), "\r\n"))
	switch line[0] {
	case '$', '=', '!':
		if n >= 0 {
			b := make([]byte, n+2)
			if _, err := io.ReadFull(r, b); err != nil {
				return out, err
			}
			out = append(out, b...)
		}
	case '*', '~', '>', '%', '|':
		if line[0] == '%' || line[0] == '|' {
			n *= 2
		}
		for range max(n, 0) {
			b, err := readRESPReply(r)
			out = append(out, b...)
			if err != nil {
				return out, err
			}
		}
	}
	return out, nil
}

// lineRequest sends req, a Go string literal of the bytes, on a new
// line-protocol connection, half-closes it, and returns all it receives.
func lineRequest(t *testing.T, addr, req string) string {
	raw, err := strconv.Unquote(req)
	if err != nil {
		t.Fatalf("line request %s is not a Go string literal: %v", req, err)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute)) // a hang guard, not a timing claim
	if _, err := c.Write([]byte(raw)); err != nil {
		t.Fatal(err)
	}
	_ = c.(*net.TCPConn).CloseWrite()
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("line request %s: %v after %q", req, err, b)
	}
	return string(b)
}

// checkRequest sends req, "METHOD PATH | Name: value | ...", to the
// endpoint at base (http://host:port) and returns the status, the header
// fields sorted (without Date), a blank line and the body.
func checkRequest(t *testing.T, base, req string) string {
	parts := strings.Split(req, " | ")
	method, path, _ := strings.Cut(parts[0], " ")
	hr, err := http.NewRequest(method, base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range parts[1:] {
		k, v, _ := strings.Cut(h, ": ")
		hr.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatalf("%s: %v", req, err)
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		t.Fatalf("%s: %v", req, err)
	}
	var hs []string
	for k, v := range res.Header {
		if k == "Date" {
			continue
		}
		hs = append(hs, k+": "+strings.Join(v, ","))
	}
	sort.Strings(hs)
	return strconv.Itoa(res.StatusCode) + "\n" + strings.Join(hs, "\n") + "\n\n" + string(body)
}

// TestRLSTranscript replays rls.txt on Envoy's rate limit service.
func TestRLSTranscript(t *testing.T) {
	f := newRLS(t, Config{Engine: engine.Tuning{MaxKeySize: 32}})
	transcript.Run(t, filepath.Join(transcriptDir, "rls.txt"), *rewrite, func(req string) string {
		return rlsRequest(f, req)
	})
}

// rlsRequest calls ShouldRateLimit with req, "domain | k=v,k=v@hits |
// ...", and renders the reply: the overall code and one line for each
// descriptor, or the gRPC error.
func rlsRequest(f *rlsFixture, req string) string {
	parts := strings.Split(req, " | ")
	r := &rlspb.RateLimitRequest{Domain: strings.TrimSpace(parts[0])}
	for _, p := range parts[1:] {
		entries, hits, ok := strings.Cut(p, "@")
		d := &rlcommon.RateLimitDescriptor{}
		for _, e := range strings.Split(entries, ",") {
			k, v, _ := strings.Cut(e, "=")
			d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
		if ok {
			n, _ := strconv.ParseUint(hits, 10, 64)
			d.HitsAddend = wrapperspb.UInt64(n)
		}
		r.Descriptors = append(r.Descriptors, d)
	}
	resp, err := f.client.ShouldRateLimit(context.Background(), r)
	if err != nil {
		st, _ := status.FromError(err)
		return "error " + st.Code().String() + ": " + st.Message() + "\n"
	}
	var b strings.Builder
	b.WriteString(resp.OverallCode.String() + "\n")
	for _, st := range resp.Statuses {
		b.WriteString(st.Code.String())
		if l := st.CurrentLimit; l != nil {
			fmt.Fprintf(&b, " limit=%d/%s", l.RequestsPerUnit, l.Unit)
			if l.Name != "" {
				b.WriteString(" name=" + l.Name)
			}
		}
		fmt.Fprintf(&b, " remaining=%d reset=%ds\n", st.LimitRemaining, st.DurationUntilReset.GetSeconds())
	}
	return b.String()
}
