// Package faultnet is a TCP proxy for tests that break the network
// between processes: one Proxy stands for one link, forwarding what
// reaches it to a target, and the test cuts the link (a partition), lets
// it swallow bytes with every connection left open (a link that drops
// packets, which TCP does not notice), or delays it.
//
// Replication's networked tests route each ordered pair of nodes' traffic
// through a Proxy of its own, so that one node can be isolated, or one
// link alone, while clients still reach every node directly.
package faultnet

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards the connections it accepts to its target, one outgoing
// connection for each, while the link is up. Safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	cut    bool          // refuse connections, and close them all
	hole   bool          // read and discard, both ways
	delay  time.Duration // hold each chunk this long before writing it
	closed bool
	wg     sync.WaitGroup

	// Swallowed counts the bytes a black hole dropped.
	Swallowed atomic.Int64
}

// Listen starts a proxy on a loopback port of its own, forwarding to
// target.
func Listen(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is the address to dial instead of the target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut takes the link down: every connection through it is closed, and new
// ones are closed as soon as they are accepted, until Heal.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
}

// Blackhole makes the link swallow what is sent either way, its
// connections left open, until Heal: the peers see silence, not an error.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	p.hole = true
	p.mu.Unlock()
}

// Delay holds every chunk of bytes d before passing it on, in order.
func (p *Proxy) Delay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// Heal brings the link back up, with no delay. Connections closed by Cut
// stay closed; the peers dial again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.cut, p.hole, p.delay = false, false, 0
	p.mu.Unlock()
}

// Close stops the proxy and closes every connection through it.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(in) {
			in.Close()
			continue
		}
		p.wg.Add(1)
		go p.forward(in)
	}
}

// track notes c, or reports false when the link is cut or the proxy
// closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut || p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) forward(in net.Conn) {
	defer p.wg.Done()
	defer p.untrack(in)
	out, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		return
	}
	if !p.track(out) {
		out.Close()
		return
	}
	defer p.untrack(out)
	var both sync.WaitGroup
	both.Add(2)
	go func() { defer both.Done(); p.pipe(out, in) }()
	go func() { defer both.Done(); p.pipe(in, out) }()
	both.Wait()
}

// chunk is bytes read from one side, to be written to the other at due.
type chunk struct {
	b    []byte
	due  time.Time
	drop bool
}

// pipe copies src to dst, each chunk of bytes held for the link's delay
// when it was read, or dropped if the link was a black hole then. An
// error ends both directions; an end of stream passes on as a half close.
func (p *Proxy) pipe(dst, src net.Conn) {
	ch := make(chan chunk, 256)
	go func() {
		defer close(ch)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				p.mu.Lock()
				c := chunk{b: buf[:n], due: time.Now().Add(p.delay), drop: p.hole}
				p.mu.Unlock()
				ch <- c
			}
			if err != nil {
				if !errors.Is(err, io.EOF) {
					dst.Close()
				}
				return
			}
		}
	}()
	for c := range ch {
		if d := time.Until(c.due); d > 0 {
			time.Sleep(d)
		}
		if c.drop {
			p.Swallowed.Add(int64(len(c.b)))
			continue
		}
		if _, err := dst.Write(c.b); err != nil {
			src.Close()
			for range ch { // let the reader end
			}
			return
		}
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}
