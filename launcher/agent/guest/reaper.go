package guest

import (
	"os"
	"os/signal"
	"sync"

	"golang.org/x/sys/unix"
)

// reaper reaps every child of this process and hands the wait status of the
// registered ones to their waiters.
type reaper struct {
	mu      sync.Mutex
	waiters map[int]chan unix.WaitStatus
	sigs    chan os.Signal
	done    chan struct{}
}

func newReaper() *reaper {
	r := &reaper{
		waiters: map[int]chan unix.WaitStatus{},
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
			ch <- ws
			delete(r.waiters, pid)
		}
	}
}

// start runs fn (which starts a process and returns its pid) with reaping
// held off, and registers the pid, so its exit cannot be missed.
func (r *reaper) start(fn func() (int, error)) (int, <-chan unix.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := fn()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan unix.WaitStatus, 1)
	r.waiters[pid] = ch
	return pid, ch, nil
}

func (r *reaper) stop() {
	signal.Stop(r.sigs)
	close(r.done)
}
