package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The docs' examples call curl; TestDocExamples gives them this stand-in,
// so that they run where curl is not installed. It does what curl does
// with the options the examples use, and TestExampleCurlIsCurl checks that
// it prints what curl prints.
const exampleCurlEnv = "SLUICE_TEST_EXAMPLE_CURL"

// exampleCurlTimeout bounds one request of the stand-in, as curl's
// --max-time would; it only stops a hang.
const exampleCurlTimeout = time.Minute

// exampleCurl runs the stand-in with curl's arguments and returns its
// exit status: curl's 7 when it cannot connect, 2 for an option it does
// not know.
func exampleCurl(args []string, stdout, stderr io.Writer) int {
	var (
		silent, showError, include bool
		method, data, url          string
		headers                    []string
	)
	usage := func(msg string) int {
		fmt.Fprintf(stderr, "curl (the stand-in of cmd/sluice/examplecurl_test.go): %s; it knows -s, -S, -i, -H, -X and -d\n", msg)
		return 2
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		value := func() (string, bool) {
			if i+1 >= len(args) {
				return "", false
			}
			i++
			return args[i], true
		}
		switch {
		case a == "--silent":
			silent = true
		case a == "--show-error":
			showError = true
		case a == "--include":
			include = true
		case a == "-H" || a == "--header" || a == "-X" || a == "--request" || a == "-d" || a == "--data":
			v, ok := value()
			if !ok {
				return usage(a + " needs a value")
			}
			switch a {
			case "-H", "--header":
				headers = append(headers, v)
			case "-X", "--request":
				method = v
			default:
				data = v
			}
		case strings.HasPrefix(a, "-") && !strings.HasPrefix(a, "--") && len(a) > 1:
			for _, c := range a[1:] {
				switch c {
				case 's':
					silent = true
				case 'S':
					showError = true
				case 'i':
					include = true
				default:
					return usage(fmt.Sprintf("option -%c in %s is not supported", c, a))
				}
			}
		case strings.HasPrefix(a, "-"):
			return usage("option " + a + " is not supported")
		case url != "":
			return usage("a second URL, " + a)
		default:
			url = a
		}
	}
	if url == "" {
		return usage("no URL")
	}
	fail := func(code int, err error) int {
		if !silent || showError {
			fmt.Fprintf(stderr, "curl: (%d) %v\n", code, err)
		}
		return code
	}
	if !strings.Contains(url, "://") {
		url = "http://" + url // as curl guesses
	}
	if !strings.HasPrefix(url, "http://") {
		return usage("only http:// URLs are supported, not " + url)
	}
	if method == "" {
		method = http.MethodGet
		if data != "" {
			method = http.MethodPost
		}
	}
	var body io.Reader
	if data != "" {
		body = strings.NewReader(data)
	}
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		return fail(3, err) // curl's "URL malformed"
	}
	req.Header.Set("User-Agent", "curl")
	req.Header.Set("Accept", "*/*")
	if data != "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for _, h := range headers {
		name, value, ok := strings.Cut(h, ":")
		if !ok {
			return usage("header " + strconv.Quote(h) + " has no colon")
		}
		req.Header.Set(strings.TrimSpace(name), strings.TrimSpace(value))
	}
	host := req.URL.Host
	if req.URL.Port() == "" {
		host = net.JoinHostPort(req.URL.Hostname(), "80")
	}
	conn, err := net.DialTimeout("tcp", host, exampleCurlTimeout)
	if err != nil {
		return fail(7, fmt.Errorf("Failed to connect to %s: %w", host, err))
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(exampleCurlTimeout))
	if err := req.Write(conn); err != nil {
		return fail(55, err) // curl's "failed sending data"
	}
	// The response's head as it came, in the server's order, which
	// http.Header does not keep.
	var raw bytes.Buffer
	resp, err := http.ReadResponse(bufio.NewReader(io.TeeReader(conn, &raw)), req)
	if err != nil {
		return fail(56, err) // curl's "failure in receiving network data"
	}
	defer resp.Body.Close()
	if include {
		head, _, ok := bytes.Cut(raw.Bytes(), []byte("\r\n\r\n"))
		if !ok {
			return fail(56, fmt.Errorf("no end of the response's head"))
		}
		stdout.Write(head)
		io.WriteString(stdout, "\r\n\r\n")
	}
	if _, err := io.Copy(stdout, resp.Body); err != nil {
		return fail(56, err)
	}
	return 0
}

// The stand-in prints what curl prints, for the options it knows, against
// a server that answers as sluice's /check does.
func TestExampleCurlIsCurl(t *testing.T) {
	curl := needTool(t, "curl", "curl")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Ratelimit-Limit", "5")
		w.Header().Set("X-Ratelimit-User", r.Header.Get("X-User"))
		w.Header().Set("X-Method", r.Method)
		if r.URL.Path == "/refuse" {
			w.Header().Set("Retry-After", "3")
			w.WriteHeader(http.StatusTooManyRequests)
		}
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %q\n", r.Method, r.URL.Path, body)
	}))
	defer srv.Close()
	// The Date field differs between two requests a second apart.
	date := regexp.MustCompile(`(?m)^Date: .*$`)
	for _, args := range [][]string{
		{"-si", "-H", "X-User: alice", srv.URL + "/check"},
		{"-s", srv.URL + "/check"},
		{"-i", srv.URL + "/refuse"},
		{"-sS", "-i", "-X", "POST", "-d", "a=b", srv.URL + "/refuse"},
		{"--silent", "--include", "--header", "X-User:bob", strings.TrimPrefix(srv.URL, "http://") + "/x"},
	} {
		out, err := exec.Command(curl, args...).Output()
		if err != nil {
			t.Fatalf("curl %q: %v", args, err)
		}
		var got bytes.Buffer
		if code := exampleCurl(args, &got, io.Discard); code != 0 {
			t.Fatalf("the stand-in, with %q: exit status %d", args, code)
		}
		want := date.ReplaceAllString(string(out), "Date: ...")
		if g := date.ReplaceAllString(got.String(), "Date: ..."); g != want {
			t.Errorf("with %q the stand-in printed\n%q\ncurl printed\n%q", args, g, want)
		}
	}
	// A refused connection: curl's exit status, and its message with -S.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String() + "/"
	l.Close()
	var stderr bytes.Buffer
	if code := exampleCurl([]string{"-sS", closed}, io.Discard, &stderr); code != 7 || !strings.HasPrefix(stderr.String(), "curl: (7) ") {
		t.Errorf("a refused connection: exit status %d, stderr %q; want 7 and curl's (7)", code, stderr.String())
	}
	if code := exampleCurl([]string{"-L", closed}, io.Discard, io.Discard); code != 2 {
		t.Errorf("an option the stand-in does not know: exit status %d, want 2", code)
	}
}
