package server

import (
	"archive/tar"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/internal/admit"
)

// BackupTrailer is the HTTP trailer GET /backup sets once the archive is
// complete, to the number of files in it: a client that reads the body to
// its end without it has a truncated archive.
const BackupTrailer = "Sluice-Backup-Files"

// serveBackup answers GET /backup with a consistent copy of the store, as
// CHECKPOINT writes it, streamed as a tar archive of one directory. It is
// how a backup leaves a container whose volume nothing else can read: the
// copy is made under --backup-dir (hard links, so it is quick and costs
// little space), streamed, and removed.
func (s *Server) serveBackup(w http.ResponseWriter, r *http.Request) {
	if code, msg := s.backupAllowed(r); code != 0 {
		if code == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Basic realm="sluice", charset="UTF-8"`)
		}
		http.Error(w, msg, code)
		return
	}
	name := "sluice-" + time.Now().UTC().Format("20060102T150405.000Z")
	// A leading dot: CHECKPOINT refuses such names, so the two never meet.
	dir, err := filepath.Abs(filepath.Join(s.cfg.BackupDir, ".stream-"+strconv.FormatInt(time.Now().UnixNano(), 36)))
	if err == nil {
		err = s.store.Checkpoint(dir)
	}
	if err != nil {
		s.log.Error("backup over HTTP: checkpoint failed", "err", err)
		http.Error(w, s.errorText(s.maintenanceErr("checkpoint", err)), http.StatusServiceUnavailable)
		return
	}
	defer func() {
		if err := os.RemoveAll(dir); err != nil {
			s.log.Error("backup over HTTP: removing the streamed checkpoint", "dir", dir, "err", err)
		}
	}()
	s.lastSave.Store(time.Now().Unix())
	entries, err := os.ReadDir(dir)
	if err != nil {
		s.log.Error("backup over HTTP", "err", err)
		http.Error(w, "ERR internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/x-tar")
	w.Header().Set("Content-Disposition", `attachment; filename="`+name+`.tar"`)
	w.Header().Set("Trailer", BackupTrailer)
	tw := tar.NewWriter(w)
	files := 0
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue // a checkpoint holds only files
		}
		if err := addFile(tw, filepath.Join(dir, e.Name()), name+"/"+e.Name()); err != nil {
			s.backupAborted(r, err)
		}
		files++
	}
	if err := tw.Close(); err != nil {
		s.backupAborted(r, err)
	}
	w.Header().Set(BackupTrailer, strconv.Itoa(files))
	s.log.Info("backup streamed over HTTP", "name", name, "files", files, "remote", r.RemoteAddr)
}

// backupAborted ends a backup whose archive could not be sent whole: the
// connection is cut, so the client sees a truncated body without the
// trailer, never an archive that looks complete.
func (s *Server) backupAborted(r *http.Request, err error) {
	s.log.Warn("backup over HTTP aborted", "remote", r.RemoteAddr, "err", err)
	panic(http.ErrAbortHandler)
}

func addFile(tw *tar.Writer, path, name string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Size: fi.Size(), Mode: 0o600, ModTime: fi.ModTime()}); err != nil {
		return err
	}
	n, err := io.Copy(tw, f)
	if err == nil && n != fi.Size() {
		err = fmt.Errorf("%s changed size while it was sent", path)
	}
	return err
}

// backupAllowed applies the RESP rules to GET /backup, which hands out
// every limit's state: with a password, HTTP basic authentication as user
// default (or no user name) with it; with --tls-ca, a client certificate
// from that CA (which the HTTP port otherwise does not require); with
// neither, protected mode admits loopback clients only. It returns 0 when
// the request may proceed.
func (s *Server) backupAllowed(r *http.Request) (int, string) {
	if s.clientCertsRequired() && (r.TLS == nil || len(r.TLS.VerifiedChains) == 0) {
		return http.StatusForbidden, "a client certificate signed by --tls-ca is required"
	}
	if s.cfg.Password != "" {
		user, pass, ok := r.BasicAuth()
		if user == "" {
			user = "default"
		}
		if !ok || !s.checkAuth([]byte(user), []byte(pass)) {
			s.stats.authFailures.Add(1)
			// Debug, not warn: every request is a new attempt, and a guesser
			// must not fill the log; sluice_auth_failures_total counts them.
			s.log.Debug("backup over HTTP: authentication failed", "remote", r.RemoteAddr, "gave_credentials", ok)
			return http.StatusUnauthorized, "WRONGPASS invalid username-password pair or user is disabled (use HTTP basic authentication with the password)"
		}
		return 0, ""
	}
	if s.protected() {
		if addr, err := net.ResolveTCPAddr("tcp", r.RemoteAddr); err != nil || !admit.IsLoopback(addr) {
			return http.StatusForbidden, deniedMessage
		}
	}
	return 0, ""
}
