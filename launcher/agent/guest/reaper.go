package guest

import (
	"os"
	"os/signal"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// exit is how a registered child ended and when it was reaped.
type exit struct {
	status unix.WaitStatus
	at     time.Time
}

// reaper reaps every child of this process and hands the wait status of the
// registered ones to their waiters.
type reaper struct {
	mu      sync.Mutex
	waiters map[int]chan exit
	sigs    chan os.Signal
	done    chan struct{}
}

func newReaper() *reaper {
	r := &reaper{
		waiters: map[int]chan exit{},
		sigs:    make(chan os.Signal, 16),
		done:    make(chan struct{}),
	}
	signal.Notify(r.sigs, unix.SIGCHLD)
	go r.loop()
	return r
}

func (r *reaper) loop() {
	for {
		select {
		case <-r.sigs:
			r.reap()
		case <-r.done:
			return
		}
	}
}

func (r *reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		if ch, ok := r.waiters[pid]; ok {
			ch <- exit{ws, time.Now()}
			delete(r.waiters, pid)
		}
	}
}

// start runs fn (which starts a process and returns its pid) with reaping
// held off, and registers the pid, so its exit cannot be missed.
func (r *reaper) start(fn func() (int, error)) (int, <-chan exit, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := fn()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan exit, 1)
	r.waiters[pid] = ch
	return pid, ch, nil
}

func (r *reaper) stop() {
	signal.Stop(r.sigs)
	close(r.done)
}
