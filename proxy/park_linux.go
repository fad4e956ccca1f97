package proxy

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// parker holds parked connections in an epoll set of its own (see
// park.go). The epoll descriptor is itself watched by the runtime's
// netpoller, so the parker's one goroutine sleeps like any reader until a
// parked socket has input or a hang-up, or the next sweep is due.
type parker struct {
	parkerBase
	epfd int
	f    *os.File // epfd, registered with the runtime's poller
	rc   syscall.RawConn
	done chan struct{} // closed when the loop has ended
	// deadline is the epoll file's read deadline, under mu: the next
	// sweep, or zero when nothing is parked.
	deadline time.Time
	work     chan *lingerConn // to an idle resumer
}

func newParker(p *Proxy, cfg parkConfig, log *zap.Logger) *parker {
	return &parker{parkerBase: parkerBase{p: p, cfg: cfg, log: log, conns: map[int]*lingerConn{}}, work: make(chan *lingerConn)}
}

// start opens the epoll set and starts the parker's goroutine.
func (pk *parker) start() error {
	fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return fmt.Errorf("epoll_create1: %w", err)
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return fmt.Errorf("epoll set non-blocking: %w", err)
	}
	f := os.NewFile(uintptr(fd), "keyway-park-epoll")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return err
	}
	// The poller must watch it: without, reads would block a thread and
	// deadlines would not work.
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		f.Close()
		return fmt.Errorf("epoll set not pollable: %w", err)
	}
	pk.epfd, pk.f, pk.rc = fd, f, rc
	pk.done = make(chan struct{})
	go pk.loop()
	return nil
}

// park takes c, whose fasthttp goroutine is ending; false means close it
// (the parker stopped, or the socket could not be watched).
func (pk *parker) park(c *lingerConn) bool {
	if c.ps.fd == 0 {
		rc, err := c.TCPConn.SyscallConn()
		if err != nil {
			return false
		}
		if err := rc.Control(func(fd uintptr) { c.ps.fd = int(fd) }); err != nil {
			return false
		}
	}
	c.ps.parkAt = false
	pk.mu.Lock()
	defer pk.mu.Unlock()
	if pk.stopped {
		return false
	}
	// One-shot: the first input or hang-up disarms it until the next park.
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT, Fd: int32(c.ps.fd)}
	op := syscall.EPOLL_CTL_ADD
	if c.ps.inEpoll {
		op = syscall.EPOLL_CTL_MOD
	}
	if err := syscall.EpollCtl(pk.epfd, op, c.ps.fd, &ev); err != nil {
		pk.log.Warn("cannot park an idle connection; closing it", zap.Error(err))
		return false
	}
	c.ps.inEpoll = true
	if pk.deadline.IsZero() {
		// The loop is waiting with no deadline: wake it for sweeps.
		pk.deadline = time.Now().Add(parkSweep)
		_ = pk.f.SetReadDeadline(pk.deadline)
	}
	pk.conns[c.ps.fd] = c
	pk.stats.parked.Add(1)
	pk.stats.parks.Add(1)
	pk.sinceReclaim++
	pk.lastPark = time.Now()
	return true
}

func (pk *parker) loop() {
	defer close(pk.done)
	var evs [128]syscall.EpollEvent
	var woken []*lingerConn
	var lastSweep time.Time
	collect := func(fd uintptr) bool {
		for {
			n, err := syscall.EpollWait(int(fd), evs[:], 0)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if n <= 0 {
				return len(woken) > 0
			}
			pk.mu.Lock()
			for _, ev := range evs[:n] {
				c := pk.conns[int(ev.Fd)]
				if c == nil || pk.stopped {
					continue
				}
				delete(pk.conns, int(ev.Fd))
				pk.stats.parked.Add(-1)
				pk.resumes.Add(1)
				woken = append(woken, c)
			}
			pk.mu.Unlock()
			if n < len(evs) {
				return len(woken) > 0
			}
		}
	}
	for {
		// Under mu, as park sets it: a park between deciding and setting
		// would otherwise have its deadline undone.
		pk.mu.Lock()
		if pk.stopped {
			pk.mu.Unlock()
			return
		}
		// The deadline is moved only when it passed (or is no longer
		// needed): not a timer update on every wake.
		if len(pk.conns) > 0 || pk.sinceReclaim >= reclaimMin || pk.reclaim.phase != 0 {
			if now := time.Now(); pk.deadline.IsZero() || !now.Before(pk.deadline) {
				next := parkSweep
				if pk.reclaim.phase != 0 {
					next = reclaimPoll
				}
				pk.deadline = now.Add(next)
				_ = pk.f.SetReadDeadline(pk.deadline)
			}
		} else if !pk.deadline.IsZero() {
			pk.deadline = time.Time{}
			_ = pk.f.SetReadDeadline(pk.deadline)
		}
		pk.mu.Unlock()
		err := pk.rc.Read(collect)
		for i, c := range woken {
			pk.stats.wakes.Add(1)
			go pk.resume(c)
			woken[i] = nil
		}
		woken = woken[:0]
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			pk.mu.Lock()
			stopped := pk.stopped // stop closed the epoll set
			pk.mu.Unlock()
			if !stopped {
				pk.log.Error("parked connections: epoll wait failed; closing them, and parking no more", zap.Error(err))
				pk.closeAll()
			}
			return
		}
		// Sweep once per parkSweep, not on every wake.
		if now := time.Now(); now.Sub(lastSweep) >= parkSweep {
			lastSweep = now
			pk.expire(now)
		} else if pk.reclaim.phase != 0 {
			pk.reclaim.step(now, false, 0, pk.log)
		}
	}
}

// resume serves a woken connection again, as fasthttp serves a new one,
// on an idle resumer goroutine if one waits, else on a new one.
func (pk *parker) resume(c *lingerConn) {
	select {
	case pk.work <- c:
	default:
		go pk.resumer(c)
	}
}

// resumer serves woken connections until none came for parkWorkerIdle.
// Reusing these goroutines matters: a new goroutine starts on a 2 KiB
// stack, and serving a request grows it to 8 KiB, copying it twice.
func (pk *parker) resumer(c *lingerConn) {
	t := time.NewTimer(parkWorkerIdle)
	defer t.Stop()
	for {
		_ = pk.p.server.ServeConn(c)
		pk.resumes.Done()
		t.Reset(parkWorkerIdle)
		select {
		case c = <-pk.work:
		case <-t.C:
			return
		}
	}
}

// expire closes the parked connections whose idle deadline passed, and
// gives memory back after a burst of parking (see reclaimMin).
func (pk *parker) expire(now time.Time) {
	var dead []*lingerConn
	pk.mu.Lock()
	for fd, c := range pk.conns {
		if !now.Before(c.ps.idleUntil) {
			delete(pk.conns, fd)
			dead = append(dead, c)
		}
	}
	pk.stats.parked.Add(-int64(len(dead)))
	reclaim := pk.sinceReclaim >= reclaimMin && now.Sub(pk.lastPark) >= reclaimQuiet &&
		(pk.lastReclaim.IsZero() || now.Sub(pk.lastReclaim) >= reclaimEvery)
	parked := len(pk.conns)
	if reclaim {
		pk.sinceReclaim = 0
		pk.lastReclaim = now
	}
	pk.mu.Unlock()
	for _, c := range dead {
		_ = c.TCPConn.Close()
	}
	pk.stats.closed.Add(uint64(len(dead)))
	pk.reclaim.step(now, reclaim, parked, pk.log)
}

// stop closes every parked connection and parks none from now on; a
// connection that would park is closed. Woken connections being served
// go on (fasthttp's Shutdown ends them); wait waits for them.
func (pk *parker) stop() {
	pk.closeAll()
	if pk.f != nil {
		_ = pk.f.Close()
		<-pk.done
		pk.f = nil
		if pk.reclaim.phase != 0 {
			memLimits.setPark(0)
			pk.reclaim.phase = 0
		}
	}
}

// closeAll closes every parked connection and parks none from now on.
func (pk *parker) closeAll() {
	pk.mu.Lock()
	pk.stopped = true
	conns := pk.conns
	pk.conns = map[int]*lingerConn{}
	pk.stats.parked.Add(-int64(len(conns)))
	pk.mu.Unlock()
	for _, c := range conns {
		_ = c.TCPConn.Close()
	}
}

// wait waits for the goroutines serving woken connections.
func (pk *parker) wait() { pk.resumes.Wait() }
