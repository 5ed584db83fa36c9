package main

import (
	"archive/tar"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/internal/conffile"
	"github.com/sluicehq/sluice/internal/httpport"
)

// backupConfig is what `sluice backup` reads from flags and environment.
type backupConfig struct {
	from            string
	out             string
	dir             string
	requirePass     string
	requirePassFile string
	cacert          string
	tlsCert         string
	tlsKey          string
	maxConfigFile   byteSize
}

// newBackupFlagSet defines the flags of sluice backup on cfg. The password
// and client certificate flags are the server's, so that a pod or a host
// that runs the server can run the backup with the same settings.
func newBackupFlagSet(cfg *backupConfig, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("sluice backup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.from, "from", "", "the server's HTTP address (host:port of its --http-addr), or an http:// or https:// URL")
	fs.StringVar(&cfg.out, "out", "", "write the backup to this file, as a tar archive of one directory; ending in /, to NAME.tar in that directory; - for stdout")
	fs.StringVar(&cfg.dir, "dir", "", "unpack the backup into this new directory, ready for sluice --data; ending in /, into NAME in that directory")
	fs.StringVar(&cfg.requirePass, "requirepass", "", "the server's password")
	fs.StringVar(&cfg.requirePassFile, "requirepass-file", "", "file holding the server's password")
	fs.StringVar(&cfg.cacert, "cacert", "", "PEM CA file that signed the server's certificate: connect over HTTPS and verify it")
	fs.StringVar(&cfg.tlsCert, "tls-cert", "", "PEM client certificate, for a server with --tls-ca (with --tls-key)")
	fs.StringVar(&cfg.tlsKey, "tls-key", "", "PEM private key of --tls-cert")
	addMaxConfigFile(fs, &cfg.maxConfigFile)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: sluice backup --from HOST:PORT (--out FILE | --dir DIR) [flags]\n\nTakes a consistent backup of a running server over its HTTP port (GET\n/backup: a CHECKPOINT streamed as a tar archive), authenticated with the\nserver's password or client certificate. Nothing is left at --out or --dir\nunless the whole backup arrived. Flags also read SLUICE_<NAME>.\n\n")
		fs.PrintDefaults()
	}
	return fs
}

// backupCommand is sluice backup: it fetches a backup from a running server.
type backupCommand struct{}

func (backupCommand) run(inv invocation, args []string) error {
	ctx, lookupEnv, stdout, stderr := inv.ctx, inv.lookupEnv, inv.stdout, inv.stderr
	var cfg backupConfig
	fs := newBackupFlagSet(&cfg, stderr)
	if err := parseArgs(fs, args, lookupEnv); err != nil {
		return err
	}
	if cfg.from == "" {
		return errors.New("--from: want the server's HTTP address, host:port")
	}
	if (cfg.out == "") == (cfg.dir == "") {
		return errors.New("--out and --dir: give one, the file to write or the directory to unpack into")
	}
	if (cfg.tlsCert == "") != (cfg.tlsKey == "") {
		return errors.New("--tls-cert and --tls-key: give both or neither")
	}
	if cfg.dir != "" && !strings.HasSuffix(cfg.dir, "/") {
		// Before asking the server for a copy it would take for nothing.
		if _, err := os.Lstat(cfg.dir); err == nil {
			return fmt.Errorf("--dir %s already exists: want a new directory, or one ending in / to create the backup in", cfg.dir)
		}
	}
	password, err := readPassword(cfg.requirePass, cfg.requirePassFile, cfg.maxConfigFile)
	if err != nil {
		return err
	}
	url, client, err := backupClient(cfg)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("--from %s: %w", cfg.from, err)
	}
	if password != "" {
		req.SetBasicAuth("default", password)
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("backup from %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("backup from %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	var name, where string
	var files int
	if cfg.out != "" {
		name, files, where, err = saveBackup(resp, cfg.out, stdout)
	} else {
		name, files, where, err = unpackBackup(resp, cfg.dir)
	}
	if err != nil {
		return fmt.Errorf("backup from %s: %w", url, err)
	}
	if cfg.out != "-" {
		fmt.Fprintf(stdout, "backup %s: %d files in %s\n", name, files, where)
	}
	return nil
}

// backupPath is where a backup named name goes: path itself, or, for a
// path ending in /, the backup's name (plus ext) inside that directory.
func backupPath(path, name, ext string) string {
	if strings.HasSuffix(path, "/") {
		return filepath.Join(path, name+ext)
	}
	return path
}

// backupClient turns --from and the TLS flags into the URL of /backup and
// a client for it.
func backupClient(cfg backupConfig) (string, *http.Client, error) {
	base := cfg.from
	if !strings.Contains(base, "://") {
		scheme := "http"
		if cfg.cacert != "" || cfg.tlsCert != "" {
			scheme = "https"
		}
		base = scheme + "://" + base
	}
	tr := &http.Transport{Proxy: http.ProxyFromEnvironment, DisableCompression: true}
	if strings.HasPrefix(base, "https://") {
		conf, err := clientTLS(cfg.cacert, cfg.tlsCert, cfg.tlsKey, cfg.maxConfigFile)
		if err != nil {
			return "", nil, err
		}
		tr.TLSClientConfig = conf
	}
	return strings.TrimSuffix(base, "/") + "/backup", &http.Client{Transport: tr}, nil
}

// clientTLS is the TLS configuration of a tool that connects to servers
// (sluice backup, sluice cluster): their certificates verified against
// cacert (the system's roots when empty), and the client certificate of
// certFile and keyFile presented when given.
func clientTLS(cacert, certFile, keyFile string, limit byteSize) (*tls.Config, error) {
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	if cacert != "" {
		pem, err := conffile.Read(cacert, int64(limit))
		if err != nil {
			return nil, fmt.Errorf("--cacert: %w", err)
		}
		conf.RootCAs = x509.NewCertPool()
		if !conf.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--cacert %s: no PEM certificate in it", cacert)
		}
	}
	if certFile != "" {
		pair, err := loadKeyPair(certFile, keyFile, limit)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert %s, --tls-key %s: %w", certFile, keyFile, err)
		}
		conf.Certificates = []tls.Certificate{pair}
	}
	return conf, nil
}

// readBackup reads the archive of resp, checking each entry, and calls fn
// with each file; it fails unless the server's trailer says the archive
// is whole.
func readBackup(resp *http.Response, fn func(name string, r io.Reader) error) (dir string, files int, err error) {
	tr := tar.NewReader(resp.Body)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return dir, files, fmt.Errorf("the archive is cut short: %w", err)
		}
		top, file, ok := strings.Cut(h.Name, "/")
		if !ok || h.Typeflag != tar.TypeReg || top == "" || top == "." || file == "" || strings.ContainsAny(file, `/\`) || file == ".." || top == ".." || (dir != "" && top != dir) {
			return dir, files, fmt.Errorf("unexpected entry %q in the archive: want the files of one directory", h.Name)
		}
		dir = top
		if err := fn(file, tr); err != nil {
			return dir, files, err
		}
		files++
	}
	// The trailer arrives with the end of the body.
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return dir, files, fmt.Errorf("the archive is cut short: %w", err)
	}
	if got := resp.Trailer.Get(httpport.BackupTrailer); got != strconv.Itoa(files) {
		return dir, files, fmt.Errorf("the archive is incomplete: %d files arrived, the server's %s trailer says %q", files, httpport.BackupTrailer, got)
	}
	if files == 0 {
		return dir, files, errors.New("the archive is empty")
	}
	return dir, files, nil
}

// saveBackup writes the archive as it arrives, to a temporary file renamed
// once it is known to be whole, or to stdout for "-". It returns the
// backup's name, its file count and the file written.
func saveBackup(resp *http.Response, out string, stdout io.Writer) (string, int, string, error) {
	var w io.Writer = stdout
	var tmp *os.File
	if out != "-" {
		var err error
		// out+"x": the directory out names when it ends in /, else the
		// one it is in.
		if tmp, err = os.CreateTemp(filepath.Dir(out+"x"), ".sluice-backup.partial-*"); err != nil {
			return "", 0, "", fmt.Errorf("--out: %w", err)
		}
		defer func() {
			tmp.Close()
			os.Remove(tmp.Name()) // gone after the rename
		}()
		w = tmp
	}
	// tee shares resp.Trailer, the map net/http fills in at the body's end.
	tee := &http.Response{Body: io.NopCloser(io.TeeReader(resp.Body, w)), Trailer: resp.Trailer}
	name, files, err := readBackup(tee, func(string, io.Reader) error { return nil })
	if err != nil || tmp == nil {
		return name, files, out, err
	}
	dst := backupPath(out, name, ".tar")
	if err := tmp.Sync(); err != nil {
		return name, files, dst, fmt.Errorf("--out: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return name, files, dst, fmt.Errorf("--out: %w", err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return name, files, dst, fmt.Errorf("--out: %w", err)
	}
	return name, files, dst, nil
}

// unpackBackup unpacks the archive into a new directory, by way of a
// temporary directory beside it renamed once the archive is whole. It
// returns the backup's name, its file count and the directory.
func unpackBackup(resp *http.Response, dir string) (string, int, string, error) {
	tmp, err := os.MkdirTemp(filepath.Dir(dir+"x"), ".sluice-backup.partial-*")
	if err != nil {
		return "", 0, "", fmt.Errorf("--dir: %w", err)
	}
	defer os.RemoveAll(tmp) // gone after the rename
	name, files, err := readBackup(resp, func(file string, r io.Reader) error {
		f, err := os.OpenFile(filepath.Join(tmp, file), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, r); err != nil {
			f.Close()
			return fmt.Errorf("the archive is cut short: %w", err)
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	})
	if err != nil {
		return name, files, dir, err
	}
	dst := backupPath(dir, name, "")
	// Rename does not replace a directory that is not empty, but would an
	// empty one: refuse it, as the check before the request did.
	if _, err := os.Lstat(dst); err == nil {
		return name, files, dst, fmt.Errorf("--dir %s already exists: want a new directory", dst)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return name, files, dst, fmt.Errorf("--dir: %w", err)
	}
	return name, files, dst, nil
}
