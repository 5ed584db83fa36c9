package server

import (
	"path/filepath"
	"testing"
)

// TestDialsTranscript replays resp/dials.txt on a server of its own with
// the rules of dials.ini: the dials it changes are the server's.
func TestDialsTranscript(t *testing.T) {
	srv := startServer(t, Config{
		Clock:      newTestClock(transcriptTime).now,
		PolicyFile: filepath.Join(transcriptDir, "dials.ini"),
	})
	runRESPTranscript(t, srv, filepath.Join(transcriptDir, "resp", "dials.txt"))
}
