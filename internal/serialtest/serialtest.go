package serialtest

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// LockFile is the file whose lock [Exclusive] takes, in the system's
// temporary directory.
const LockFile = "spillway-heavy-tests.lock"

// Exclusive blocks until no other heavy test on this machine holds the
// lock, takes it, and releases it when t and its subtests have finished.
// It logs how long it waited. A test that cannot open or lock the file
// fails.
func Exclusive(t testing.TB) {
	t.Helper()
	path := filepath.Join(os.TempDir(), LockFile)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatalf("serialtest: %v", err)
	}
	began := time.Now()
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		t.Fatalf("serialtest: locking %s: %v", path, err)
	}
	if waited := time.Since(began); waited > 100*time.Millisecond {
		t.Logf("serialtest: waited %v for another heavy test to finish", waited.Round(time.Millisecond))
	}
	t.Cleanup(func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		_ = f.Close()
	})
}
