package flock

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestExclusive(t *testing.T) {
	p := filepath.Join(t.TempDir(), ".lock")
	release, err := Exclusive(context.Background(), p, "another builder")
	if err != nil {
		t.Fatal(err)
	}
	// Held: a second taker waits until its context ends.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := Exclusive(ctx, p, "another builder"); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "waiting for another builder") {
		t.Fatalf("second lock while held: %v", err)
	}
	// Released: a waiting taker gets it.
	done := make(chan error, 1)
	go func() {
		r, err := Exclusive(context.Background(), p, "x")
		if err == nil {
			r()
		}
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	release()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter never got the released lock")
	}
	if _, err := Exclusive(context.Background(), filepath.Join(t.TempDir(), "no/such/dir/.lock"), "x"); err == nil {
		t.Error("a lock in a missing directory")
	}
}
