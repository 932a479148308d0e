package qemu

import (
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"
)

// fakeQEMUEnv makes the test binary act as a QEMU that ignores quit and SIGTERM
// (it has no QMP socket at all), for the escalation test; it is started with argv[0]
// "qemu-system-x86_64" so that the driver's cmdline check accepts it.
const fakeQEMUEnv = "SBX_QEMU_TEST_FAKE"

func TestMain(m *testing.M) {
	if os.Getenv(fakeQEMUEnv) == "stubborn" {
		signal.Ignore(syscall.SIGTERM)
		time.Sleep(time.Minute)
		os.Exit(3)
	}
	os.Exit(m.Run())
}
