package clusternode

import (
	"bufio"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/policy"
)

// fakeOwner is a node that answers every SLUICE.COUNTERHIT it reads with
// the same outcome, in order: what the forwarder sees of an owner.
type fakeOwner struct {
	l     net.Listener
	dials atomic.Int64 // connections accepted
	reqs  atomic.Int64 // commands read
	// closeNext closes the connection instead of answering, that many
	// times.
	closeNext atomic.Int64
	wg        sync.WaitGroup

	mu struct {
		sync.Mutex
		// hold, when set, stops the owner from answering until it is
		// closed.
		hold chan struct{}
		// reply, when set, is answered instead of fakeReply.
		reply string
	}
}

// setHold has the owner wait for hold to close before each answer.
func (o *fakeOwner) setHold(hold chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.mu.hold = hold
}

// setReply has the owner answer reply; "" is fakeReply.
func (o *fakeOwner) setReply(reply string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.mu.reply = reply
}

// fakeReply is an allowed hit: 9 left of 10, reset in 60 s.
const fakeReply = "*6\r\n:1\r\n:9\r\n:60\r\n:10\r\n:0\r\n:60000\r\n"

func startFakeOwner(t testing.TB) *fakeOwner {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := &fakeOwner{l: l}
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			o.dials.Add(1)
			o.wg.Add(1)
			go func() {
				defer o.wg.Done()
				defer c.Close()
				o.serve(c)
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		o.wg.Wait()
	})
	return o
}

// serve answers each RESP array command read from c, writing the replies
// of the commands read so far in one write, as a server does a pipeline;
// an AUTH gets +OK.
func (o *fakeOwner) serve(c net.Conn) {
	r := bufio.NewReader(c)
	w := bufio.NewWriter(c)
	for {
		auth, err := readCommand(r)
		if err != nil {
			return
		}
		o.reqs.Add(1)
		o.mu.Lock()
		hold, reply := o.mu.hold, o.mu.reply
		o.mu.Unlock()
		if hold != nil {
			<-hold
		}
		if o.closeNext.Add(-1) >= 0 {
			return
		}
		o.closeNext.Store(0)
		switch {
		case auth:
			reply = "+OK\r\n"
		case reply == "":
			reply = fakeReply
		}
		w.WriteString(reply)
		if r.Buffered() == 0 {
			if w.Flush() != nil {
				return
			}
		}
	}
}

// readCommand reads one command, an array of bulk strings, and reports
// whether it is an AUTH.
func readCommand(r *bufio.Reader) (auth bool, err error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return false, err
	}
	n, _ := strconv.Atoi(string(line[1 : len(line)-2]))
	for i := range n {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return false, err
		}
		size, _ := strconv.Atoi(string(line[1 : len(line)-2]))
		if i == 0 {
			name, err := r.Peek(size)
			if err != nil {
				return false, err
			}
			auth = string(name) == "AUTH"
		}
		if _, err := r.Discard(size + 2); err != nil {
			return false, err
		}
	}
	return auth, nil
}

// BenchmarkForwardCounter forwards counter hits to one owner from many
// goroutines at once (-cpu × 32), as a node under load does: ns and
// allocations per forwarded hit, and the connections the owner accepted.
func BenchmarkForwardCounter(b *testing.B) {
	o := startFakeOwner(b)
	s := &Node{}
	defer s.fwd.closeAll()
	r := &policy.Rule{Pos: 1}
	key := []byte("some-counter-key")
	addr := o.l.Addr().String()
	b.ReportAllocs()
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			out, err := s.forwardHit(addr, 1, key, r, 10, 1, 1)
			if err != nil || out.CreditsLeft != 9 {
				b.Errorf("forwardHit: %+v, %v", out, err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(o.dials.Load()), "dials")
}
