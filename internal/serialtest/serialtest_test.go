package serialtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// While one test holds the lock, a test in another process cannot take
// it; once the holder ends, it can. The other process is a helper run of
// this test binary: flock locks belong to open files, so the point is to
// show them blocking across processes, as between test binaries.
func TestExclusiveBlocksOtherProcesses(t *testing.T) {
	if os.Getenv("SERIALTEST_HELPER") == "1" {
		Exclusive(t)
		return
	}
	// A lock of its own, not the one the heavy tests of other packages
	// running now hold; the helper inherits it with the environment.
	t.Setenv("TMPDIR", t.TempDir())
	var done chan error
	t.Run("holder", func(t *testing.T) {
		Exclusive(t)
		cmd := exec.Command(os.Args[0], "-test.run", "^TestExclusiveBlocksOtherProcesses$")
		cmd.Env = append(os.Environ(), "SERIALTEST_HELPER=1")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done = make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			t.Fatalf("the helper finished (%v) while the lock was held", err)
		case <-time.After(300 * time.Millisecond):
		}
	}) // the holder's cleanup releases the lock here
	if done == nil {
		return
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("helper: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the helper did not get the lock after the holder finished")
	}
}

// The lock is on a file in the temporary directory, so test binaries of
// different packages share it.
func TestLockFileIsShared(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	Exclusive(t)
	f, err := os.Open(filepath.Join(os.TempDir(), LockFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != syscall.EWOULDBLOCK {
		t.Fatalf("a second lock on the file: %v, want EWOULDBLOCK while it is held", err)
	}
}
