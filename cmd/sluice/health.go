package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// healthConfig is what `sluice health` reads: the server's own flags and
// variables for where and how to connect, so that in a container it checks
// exactly what the server serves.
type healthConfig struct {
	addr            string
	httpAddr        string
	requirePass     string
	requirePassFile string
	tlsCert         string
	tlsKey          string
	tlsCA           string
	timeout         time.Duration
	maxConfigFile   byteSize
}

// newHealthFlagSet defines the flags of sluice health on cfg: the server's
// connection flags with the server's defaults, and the check's timeout.
func newHealthFlagSet(cfg *healthConfig, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("sluice health", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addrVar(fs, &cfg.addr, "addr", "127.0.0.1:9049", "127.0.0.1:9049", true, "the server's RESP address; checked when --http-addr is empty")
	addrVar(fs, &cfg.httpAddr, "http-addr", "127.0.0.1:9050", "127.0.0.1:9050", true, "the server's HTTP address, whose /readyz is checked; empty checks READY over RESP")
	fs.StringVar(&cfg.requirePass, "requirepass", "", "the server's password, for the RESP check")
	fs.StringVar(&cfg.requirePassFile, "requirepass-file", "", "file holding the server's password, for the RESP check")
	fs.StringVar(&cfg.tlsCert, "tls-cert", "", "the server's PEM certificate: connect over TLS and accept only this certificate")
	fs.StringVar(&cfg.tlsKey, "tls-key", "", "the private key of --tls-cert; the RESP check presents the pair as its client certificate when --tls-ca is set")
	fs.StringVar(&cfg.tlsCA, "tls-ca", "", "the server's client CA: set when the server requires client certificates on RESP")
	durationVar(fs, &cfg.timeout, "health-timeout", 5*time.Second, "the longest the check takes; past it, it fails")
	addMaxConfigFile(fs, &cfg.maxConfigFile)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: sluice health [flags]\n\nChecks that a sluice server is ready, for a container's HEALTHCHECK: GET\n/readyz on --http-addr, or, with --http-addr empty, AUTH and READY on --addr.\nExits 0 when ready and 1 otherwise, saying why. An address without a host\nor with 0.0.0.0 or :: is checked on loopback. It reads the server's SLUICE_*\nvariables, so in a container it checks what the server serves.\n\n")
		fs.PrintDefaults()
	}
	return fs
}

// healthCommand is sluice health: it checks the server once and returns
// nil when it is ready.
type healthCommand struct{}

func (healthCommand) run(inv invocation, args []string) error {
	lookupEnv, stdout, stderr := inv.lookupEnv, inv.stdout, inv.stderr
	var cfg healthConfig
	fs := newHealthFlagSet(&cfg, stderr)
	if err := parseArgs(fs, args, lookupEnv); err != nil {
		return err
	}
	if cfg.timeout <= 0 {
		return fmt.Errorf("--health-timeout %v: want a positive duration", cfg.timeout)
	}
	if cfg.httpAddr == "" && cfg.addr == "" {
		return errors.New("--addr and --http-addr are both empty: nothing to check")
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
	defer cancel()
	var tlsConf *tls.Config
	if cfg.tlsCert != "" {
		var err error
		if tlsConf, err = pinnedTLS(cfg); err != nil {
			return err
		}
	}
	var what string
	var err error
	if cfg.httpAddr != "" {
		what, err = checkReadyz(ctx, cfg.httpAddr, tlsConf)
	} else {
		what, err = checkREADY(ctx, cfg, tlsConf)
	}
	if err != nil {
		return fmt.Errorf("not ready: %s: %w", what, err)
	}
	fmt.Fprintln(stdout, "ready:", what)
	return nil
}

// loopback turns a listen address into one to connect to: a server
// listening on every interface is reached on loopback.
func loopback(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified() && ip.To4() != nil) {
		host = "127.0.0.1"
	} else if ip != nil && ip.IsUnspecified() {
		host = "::1"
	}
	return net.JoinHostPort(host, port), nil
}

// pinnedTLS connects to the server presenting the certificate of
// --tls-cert and no other: the check talks to its own server, whose
// certificate may name a host that loopback is not, and it trusts exactly
// what the server is configured to serve.
func pinnedTLS(cfg healthConfig) (*tls.Config, error) {
	pair, err := loadKeyPair(cfg.tlsCert, cfg.tlsKey, cfg.maxConfigFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert %s, --tls-key %s: %w", cfg.tlsCert, cfg.tlsKey, err)
	}
	want := pair.Certificate[0]
	conf := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // replaced by the pin below
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 || !bytes.Equal(raw[0], want) {
				return fmt.Errorf("the server's certificate is not the one in --tls-cert %s (not reloaded yet with SIGHUP?)", cfg.tlsCert)
			}
			return nil
		},
	}
	if cfg.tlsCA != "" {
		conf.Certificates = []tls.Certificate{pair}
	}
	return conf, nil
}

// checkReadyz asks /readyz, which needs neither a password nor a client
// certificate.
func checkReadyz(ctx context.Context, httpAddr string, tlsConf *tls.Config) (string, error) {
	addr, err := loopback(httpAddr)
	if err != nil {
		return "--http-addr", err
	}
	scheme := "http"
	if tlsConf != nil {
		scheme = "https"
	}
	url := scheme + "://" + addr + "/readyz"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return url, err
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConf, DisableKeepAlives: true, Proxy: nil}}
	resp, err := client.Do(req)
	if err != nil {
		return url, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	text := strings.TrimSpace(string(body))
	if resp.StatusCode != http.StatusOK {
		return url, fmt.Errorf("%s: %s", resp.Status, text)
	}
	return url + " " + text, nil
}

// checkREADY sends AUTH (when there is a password) and READY over RESP.
func checkREADY(ctx context.Context, cfg healthConfig, tlsConf *tls.Config) (string, error) {
	addr, err := loopback(cfg.addr)
	if err != nil {
		return "--addr", err
	}
	what := "READY on " + addr
	password, err := readPassword(cfg.requirePass, cfg.requirePassFile, cfg.maxConfigFile)
	if err != nil {
		return what, err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return what, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if tlsConf != nil {
		tc := tls.Client(conn, tlsConf)
		if err := tc.HandshakeContext(ctx); err != nil {
			return what, err
		}
		conn = tc
	}
	var cmd []byte
	if password != "" {
		cmd = appendCommand(cmd, "AUTH", password)
	}
	cmd = appendCommand(cmd, "READY")
	if _, err := conn.Write(cmd); err != nil {
		return what, err
	}
	r := bufio.NewReader(conn)
	if password != "" {
		if line, err := readLine(r); err != nil {
			return what, err
		} else if line != "+OK" {
			return what, fmt.Errorf("AUTH: %s", strings.TrimPrefix(line, "-"))
		}
	}
	line, err := readLine(r)
	switch {
	case err != nil:
		return what, err
	case line == ":1":
		return what, nil
	case line == ":0":
		return what, errors.New("READY 0: the store refuses changes or the server is shutting down (see /readyz or INFO persistence)")
	}
	return what, fmt.Errorf("READY: %s", strings.TrimPrefix(line, "-"))
}

func appendCommand(b []byte, args ...string) []byte {
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(len(args)), 10)
	b = append(b, "\r\n"...)
	for _, a := range args {
		b = append(b, '$')
		b = strconv.AppendInt(b, int64(len(a)), 10)
		b = append(b, "\r\n"...)
		b = append(b, a...)
		b = append(b, "\r\n"...)
	}
	return b
}

func readLine(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		if errors.Is(err, io.EOF) {
			return "", errors.New("the server closed the connection")
		}
		return "", err
	}
	return strings.TrimRight(line, "\r\n"), nil
}
