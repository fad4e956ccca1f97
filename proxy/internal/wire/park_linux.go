package wire

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// Parker holds parked connections in an epoll set of its own (see
// park.go). The epoll descriptor is itself watched by the runtime's
// netpoller, so the parker's one goroutine sleeps like any reader until a
// parked socket has input or a hang-up, or the next sweep is due.
type Parker struct {
	parkerBase
	epfd int
	f    *os.File // epfd, registered with the runtime's poller
	rc   syscall.RawConn
	done chan struct{} // closed when the loop has ended
	// deadline is the epoll file's read deadline, under mu: the next
	// sweep, or zero when nothing is parked.
	deadline time.Time
	work     chan *ClientConn // to an idle resumer
}

func newParker() *Parker {
	pk := &Parker{work: make(chan *ClientConn)}
	pk.conns = map[int]*ClientConn{}
	return pk
}

// Start opens the epoll set and starts the parker's goroutine.
func (pk *Parker) Start() error {
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
func (pk *Parker) park(c *ClientConn) bool {
	if c.ps.fd == 0 {
		rc, err := c.tcp.SyscallConn()
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
	pk.stats.Parked.Add(1)
	pk.stats.Parks.Add(1)
	pk.sinceReclaim++
	pk.lastPark = time.Now()
	return true
}

func (pk *Parker) loop() {
	defer close(pk.done)
	var evs [128]syscall.EpollEvent
	var woken []*ClientConn
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
				// Input (or a hang-up) woke it: not waiting any more, so
				// that a stopping server does not close it unread
				// before its resumer reads (Front.CloseWaiting).
				c.waiting.Store(false)
				pk.stats.Parked.Add(-1)
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
		if len(pk.conns) > 0 || pk.sinceReclaim >= ReclaimMin || pk.reclaiming {
			if now := time.Now(); pk.deadline.IsZero() || !now.Before(pk.deadline) {
				next := parkSweep
				if pk.reclaiming {
					next = ReclaimPoll
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
			pk.stats.Wakes.Add(1)
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
				pk.closeAll(false)
			}
			return
		}
		// Sweep once per parkSweep, not on every wake.
		if now := time.Now(); now.Sub(lastSweep) >= parkSweep {
			lastSweep = now
			pk.expire(now)
		} else {
			pk.stepReclaim(now, false, 0)
		}
	}
}

// resume serves a woken connection again, as fasthttp serves a new one,
// on an idle resumer goroutine if one waits, else on a new one.
func (pk *Parker) resume(c *ClientConn) {
	select {
	case pk.work <- c:
	default:
		go pk.resumer(c)
	}
}

// resumer serves woken connections until none came for ParkWorkerIdle.
// Reusing these goroutines matters: a new goroutine starts on a 2 KiB
// stack, and serving a request grows it to 8 KiB, copying it twice.
func (pk *Parker) resumer(c *ClientConn) {
	t := time.NewTimer(ParkWorkerIdle)
	defer t.Stop()
	for {
		_ = pk.srv.ServeConn(c)
		pk.resumes.Done()
		t.Reset(ParkWorkerIdle)
		select {
		case c = <-pk.work:
		case <-t.C:
			return
		}
	}
}

// expire closes the parked connections whose idle deadline passed, and
// gives memory back after a burst of parking (see ReclaimMin).
func (pk *Parker) expire(now time.Time) {
	var dead []*ClientConn
	pk.mu.Lock()
	for fd, c := range pk.conns {
		if !now.Before(c.ps.idleUntil) {
			delete(pk.conns, fd)
			dead = append(dead, c)
		}
	}
	pk.stats.Parked.Add(-int64(len(dead)))
	reclaim := pk.sinceReclaim >= ReclaimMin && now.Sub(pk.lastPark) >= reclaimQuiet &&
		(pk.lastReclaim.IsZero() || now.Sub(pk.lastReclaim) >= reclaimEvery)
	parked := len(pk.conns)
	if reclaim {
		pk.sinceReclaim = 0
		pk.lastReclaim = now
	}
	pk.mu.Unlock()
	for _, c := range dead {
		c.front.open.remove(c)
		_ = c.tcp.Close()
	}
	pk.stats.Closed.Add(uint64(len(dead)))
	pk.stepReclaim(now, reclaim, parked)
}

// Stop closes every parked connection and parks none from now on; a
// connection that would park is closed. A parked connection whose request
// has arrived, but which the parker's loop has not woken yet, is served
// rather than closed under it. Woken connections being served go on
// (fasthttp's Shutdown ends them); Wait waits for them.
func (pk *Parker) Stop() {
	for _, c := range pk.closeAll(true) {
		pk.stats.Wakes.Add(1)
		pk.resume(c)
	}
	if pk.f != nil {
		_ = pk.f.Close()
		<-pk.done
		pk.f = nil
		pk.abortReclaim()
	}
}

// closeAll closes every parked connection and parks none from now on.
// With serveInput, it closes only those no input waits on, and returns the
// others, registered as resuming, for the caller to resume.
func (pk *Parker) closeAll(serveInput bool) []*ClientConn {
	pk.mu.Lock()
	pk.stopped = true
	conns := pk.conns
	pk.conns = map[int]*ClientConn{}
	pk.stats.Parked.Add(-int64(len(conns)))
	pk.mu.Unlock()
	// Stopped: the loop wakes none of them any more, they are this
	// goroutine's alone.
	var serve []*ClientConn
	for _, c := range conns {
		if serveInput && c.hasInput() {
			c.waiting.Store(false)
			pk.resumes.Add(1)
			serve = append(serve, c)
			continue
		}
		c.front.open.remove(c)
		_ = c.tcp.Close()
	}
	return serve
}

// Wait waits for the goroutines serving woken connections.
func (pk *Parker) Wait() { pk.resumes.Wait() }
