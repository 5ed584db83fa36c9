package httpport

import (
	"archive/tar"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/storage"
)

// BackupTrailer is the HTTP trailer GET /backup sets once the archive is
// complete, to the number of files in it: a client that reads the body to
// its end without it has a truncated archive.
const BackupTrailer = "Sluice-Backup-Files"

// Backup answers GET /backup with a consistent copy of the store, as
// CHECKPOINT writes it, streamed as a tar archive of one directory. It is
// how a backup leaves a container whose volume nothing else can read: the
// copy is made under Dir (--backup-dir; hard links, so it is quick and
// costs little space), streamed, and removed.
type Backup struct {
	Store  *storage.Store
	Dir    string
	Logger *slog.Logger
	Access *Access // who may take one
	Host   BackupHost
}

// BackupHost is what a backup asks of the server.
type BackupHost interface {
	// CheckpointFailed is the text to answer when the store's checkpoint
	// failed with err, which it logs when it must.
	CheckpointFailed(err error) string
	// Checkpointed notes that a checkpoint was taken (LASTSAVE).
	Checkpointed()
}

// ServeHTTP implements http.Handler.
func (b *Backup) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if b.Access.refused(w, r) {
		return
	}
	name := "sluice-" + time.Now().UTC().Format("20060102T150405.000Z")
	// A leading dot: CHECKPOINT refuses such names, so the two never meet.
	dir, err := filepath.Abs(filepath.Join(b.Dir, ".stream-"+strconv.FormatInt(time.Now().UnixNano(), 36)))
	if err == nil {
		err = b.Store.Checkpoint(dir)
	}
	if err != nil {
		b.Logger.Error("backup over HTTP: checkpoint failed", "err", err)
		http.Error(w, b.Host.CheckpointFailed(err), http.StatusServiceUnavailable)
		return
	}
	defer func() {
		if err := os.RemoveAll(dir); err != nil {
			b.Logger.Error("backup over HTTP: removing the streamed checkpoint", "dir", dir, "err", err)
		}
	}()
	b.Host.Checkpointed()
	entries, err := os.ReadDir(dir)
	if err != nil {
		b.Logger.Error("backup over HTTP", "err", err)
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
			b.aborted(r, err)
		}
		files++
	}
	if err := tw.Close(); err != nil {
		b.aborted(r, err)
	}
	w.Header().Set(BackupTrailer, strconv.Itoa(files))
	b.Logger.Info("backup streamed over HTTP", "name", name, "files", files, "remote", r.RemoteAddr)
}

// aborted ends a backup whose archive could not be sent whole: the
// connection is cut, so the client sees a truncated body without the
// trailer, never an archive that looks complete.
func (b *Backup) aborted(r *http.Request, err error) {
	b.Logger.Warn("backup over HTTP aborted", "remote", r.RemoteAddr, "err", err)
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
