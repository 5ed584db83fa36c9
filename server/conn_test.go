package server

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/storage"
)

// rawClient speaks RESP over a plain TCP connection, so the test holds no
// client library buffers and sees exactly what the server sends.
type rawClient struct {
	t    testing.TB
	conn net.Conn
	r    *bufio.Reader
}

func dialRaw(t testing.TB, srv *Server) *rawClient {
	t.Helper()
	conn, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	// A hang guard, not a timing claim.
	_ = conn.SetDeadline(time.Now().Add(2 * time.Minute))
	return &rawClient{t: t, conn: conn, r: bufio.NewReader(conn)}
}

func (c *rawClient) write(p []byte) {
	c.t.Helper()
	if _, err := c.conn.Write(p); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// reply reads one reply and returns its first line; the content of bulk
// strings is discarded, so a big reply costs the test no memory.
func (c *rawClient) reply() string {
	c.t.Helper()
	line, err := c.r.ReadString('\n')
	if err != nil {
		c.t.Fatalf("read reply: %v (got %q)", err, line)
	}
	line = strings.TrimSuffix(line, "\r\n")
	switch line[0] {
	case '$':
		n, _ := strconv.Atoi(line[1:])
		if n >= 0 {
			if _, err := io.CopyN(io.Discard, c.r, int64(n)+2); err != nil {
				c.t.Fatalf("read bulk of %d bytes: %v", n, err)
			}
		}
	case '*':
		n, _ := strconv.Atoi(line[1:])
		for range n {
			c.reply()
		}
	}
	return line
}

func (c *rawClient) expect(want string) {
	c.t.Helper()
	if got := c.reply(); got != want {
		c.t.Fatalf("reply %q, want %q", got, want)
	}
}

// expectClosed checks that the server closed the connection.
func (c *rawClient) expectClosed() {
	c.t.Helper()
	if b, err := c.r.ReadByte(); err == nil {
		rest, _ := c.r.ReadString('\n')
		c.t.Fatalf("connection still open; read %q", string(b)+rest)
	}
}

func respCommand(args ...[]byte) []byte {
	b := fmt.Appendf(nil, "*%d\r\n", len(args))
	for _, a := range args {
		b = fmt.Appendf(b, "$%d\r\n", len(a))
		b = append(b, a...)
		b = append(b, '\r', '\n')
	}
	return b
}

// heapInuse is the live heap after a collection.
func heapInuse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

// Item 7: a client that once sent a big command and then idles holds a few
// KiB, not the command's size several times over for the rest of its life.
func TestIdleConnectionsLetBigCommandsGo(t *testing.T) {
	const clients, size = 4, 7 << 20
	srv := startServer(t, Config{RESP: respserver.Tuning{MaxBulk: 8 << 20, MaxQueryBuffer: 16 << 20}})
	conns := make([]*rawClient, clients)
	for i := range conns {
		conns[i] = dialRaw(t, srv)
		conns[i].write([]byte("PING\r\n"))
		conns[i].expect("+PONG")
	}
	before := heapInuse()
	cmd := respCommand([]byte("ECHO"), bytes.Repeat([]byte("x"), size))
	for _, c := range conns {
		c.write(cmd)
		c.expect("$" + strconv.Itoa(size))
		// Served after the ECHO pipeline is done with, buffers included.
		c.write([]byte("PING\r\n"))
		c.expect("+PONG")
	}
	cmd = nil
	grew := heapInuse() - before
	t.Logf("%d idle clients that each sent a %d MiB command: server heap grew %d KiB", clients, size>>20, grew>>10)
	if grew > 2<<20 {
		t.Fatalf("heap grew %d KiB after the commands were answered; idle connections should hold a few KiB each", grew>>10)
	}
}

// Item 7, before AUTH: a client that has not authenticated may send at
// most 10 arguments of 16 KiB, as in Redis; AUTH lifts that for the
// commands pipelined behind it.
func TestUnauthenticatedLimits(t *testing.T) {
	srv := startServer(t, Config{Listen: admit.Config{Password: "pw"}, RESP: respserver.Tuning{MaxBulk: 8 << 20, MaxQueryBuffer: 16 << 20}})

	c := dialRaw(t, srv)
	c.write(respCommand([]byte("ECHO"), bytes.Repeat([]byte("x"), 16<<10)))
	c.expect("-NOAUTH Authentication required.")
	// The server closes before all of it is sent: write from aside.
	go c.conn.Write(respCommand([]byte("ECHO"), bytes.Repeat([]byte("x"), 7<<20)))
	c.expect("-ERR Protocol error: bulk length 7340032 exceeds the limit of 16384 (for clients that have not authenticated; AUTH first)")
	c.expectClosed()

	c = dialRaw(t, srv)
	args := make([][]byte, 11)
	for i := range args {
		args[i] = []byte("a")
	}
	c.write(respCommand(args...))
	c.expect("-ERR Protocol error: 11 arguments exceed the limit of 10 (for clients that have not authenticated; AUTH first)")
	c.expectClosed()

	c = dialRaw(t, srv)
	c.write([]byte(strings.Repeat("x", 70<<10)))
	c.expect("-ERR Protocol error: too big inline request: line exceeds the limit of 16384 bytes (for clients that have not authenticated; AUTH first)")
	c.expectClosed()

	// AUTH in the same write as a big command and a long one.
	c = dialRaw(t, srv)
	in := respCommand([]byte("AUTH"), []byte("pw"))
	in = append(in, respCommand([]byte("ECHO"), bytes.Repeat([]byte("y"), 1<<20))...)
	in = append(in, respCommand(args...)...)
	in = append(in, "PING\r\n"...)
	c.write(in)
	c.expect("+OK")
	c.expect("$1048576")
	if got := c.reply(); !strings.HasPrefix(got, "-ERR unknown command 'a'") {
		t.Fatalf("11 arguments after AUTH: %q, want the unknown-command error", got)
	}
	c.expect("+PONG")
}

// Item 8: a client that pipelines CLIENT LIST on a server with many
// connections gets its replies in chunks: no buffer the size of the whole
// pipeline's replies is built, or kept afterwards.
func TestClientListPipelineBounded(t *testing.T) {
	const idle, attackers, depth = 300, 4, 600
	srv := startServer(t, Config{})
	for range idle {
		dialRaw(t, srv)
	}
	att := make([]*rawClient, attackers)
	for i := range att {
		att[i] = dialRaw(t, srv)
		att[i].write([]byte("PING\r\n"))
		att[i].expect("+PONG")
	}
	before := heapInuse()
	in := bytes.Repeat([]byte("CLIENT LIST\r\n"), depth)
	for _, c := range att {
		c.write(in)
	}
	for _, c := range att {
		for range depth {
			if got := c.reply(); got[0] != '$' {
				t.Fatalf("CLIENT LIST: %q", got)
			}
		}
		c.write([]byte("PING\r\n"))
		c.expect("+PONG")
	}
	grew := heapInuse() - before
	t.Logf("%d clients pipelining %d CLIENT LIST with %d connections open: server heap grew %d KiB", attackers, depth, idle+attackers, grew>>10)
	if grew > 4<<20 {
		t.Fatalf("heap grew %d KiB after the pipelines were answered", grew>>10)
	}
}

// The accounting behind --maxmemory-clients: an idle connection counts a
// few KiB whatever it sent, and the peak stays near a chunk plus one reply
// per client even while pipelines of big replies run.
func TestClientBuffersAccounted(t *testing.T) {
	const idle, attackers, depth = 300, 4, 2000
	srv := startServer(t, Config{RESP: respserver.Tuning{MaxBulk: 8 << 20, MaxQueryBuffer: 16 << 20}})
	for range idle {
		c := dialRaw(t, srv)
		c.write([]byte("PING\r\n"))
		c.expect("+PONG")
	}
	c := dialRaw(t, srv)
	c.write(respCommand([]byte("ECHO"), bytes.Repeat([]byte("x"), 7<<20)))
	c.expect("$7340032")
	c.write([]byte("PING\r\n"))
	c.expect("+PONG")
	perConn := srv.stats.ClientMem.Load() / (idle + 1)
	t.Logf("client buffers: %d bytes per idle connection", perConn)
	if perConn > 8<<10 {
		t.Fatalf("%d bytes of buffers per idle connection, want a few KiB", perConn)
	}

	srv.stats.ClientMemPeak.Store(srv.stats.ClientMem.Load())
	base := srv.stats.ClientMem.Load()
	done := make(chan error, attackers)
	in := bytes.Repeat([]byte("CLIENT LIST\r\n"), depth)
	for range attackers {
		a := dialRaw(t, srv)
		go func() {
			if _, err := a.conn.Write(in); err != nil {
				done <- err
				return
			}
			for range depth {
				if err := skipBulk(a.r); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for range attackers {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	peak := srv.stats.ClientMemPeak.Load() - base
	// Each attacker: a read buffer, its commands, a 16 KiB chunk and one
	// CLIENT LIST reply (about 25 KiB here).
	t.Logf("%d clients pipelining %d CLIENT LIST: client buffers peaked %d KiB above the idle ones", attackers, depth, peak>>10)
	if peak > attackers*(256<<10) {
		t.Fatalf("client buffers peaked %d KiB above idle, want about a chunk and a reply per client", peak>>10)
	}
}

// --maxmemory-clients: the client whose buffers push the total past it is
// told so and closed; the others go on.
func TestMaxMemoryClients(t *testing.T) {
	srv := startServer(t, Config{RESP: respserver.Tuning{MaxMemoryClients: respserver.LimitOf[int64](2 << 20), MaxBulk: 8 << 20, MaxQueryBuffer: 16 << 20}})
	other := dialRaw(t, srv)
	other.write([]byte("PING\r\n"))
	other.expect("+PONG")
	c := dialRaw(t, srv)
	c.write(respCommand([]byte("ECHO"), bytes.Repeat([]byte("x"), 3<<20)))
	c.expect("-ERR client memory limit reached: the buffers of all clients exceed --maxmemory-clients; closing the connection")
	c.expectClosed()
	other.write([]byte("INFO stats\r\n"))
	if got := other.reply(); got[0] != '$' {
		t.Fatalf("INFO: %q", got)
	}
	other.write(respCommand([]byte("ECHO"), bytes.Repeat([]byte("x"), 256<<10)))
	other.expect("$262144")
	if n := srv.stats.EvictedClients.Load(); n != 1 {
		t.Fatalf("evicted clients = %d, want 1", n)
	}
}

// skipBulk reads one bulk string reply without keeping it.
func skipBulk(r *bufio.Reader) error {
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(strings.TrimSuffix(line[1:], "\r\n"))
	if line[0] != '$' || err != nil {
		return fmt.Errorf("reply %q, want a bulk string", line)
	}
	_, err = io.CopyN(io.Discard, r, int64(n)+2)
	return err
}

// A pipeline whose replies span several chunks: each chunk is sent after
// the writes before it are committed, and every reply arrives in order.
func TestLongPipelineInChunks(t *testing.T) {
	store, err := storage.Open(t.TempDir(), storage.Options{Sync: storage.SyncAlways})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	serveOn(t, srv, store)
	const n = 5000 // about 40 KiB of replies: three chunks
	var in []byte
	for range n {
		in = append(in, respCommand([]byte("RL.REDUCE"), []byte("k"), []byte("100000"), []byte("60"), []byte("AT"), []byte("1000"))...)
	}
	c := dialRaw(t, srv)
	c.write(in)
	for i := range n {
		c.expect(":" + strconv.Itoa(100000-i))
	}
	if got := store.Stats().KeysWritten; got == 0 {
		t.Fatalf("keys written = %d, want the pipeline's writes committed", got)
	}
}

// isTimeout reports whether err is a network timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
