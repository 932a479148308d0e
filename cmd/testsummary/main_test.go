package main

import (
	"strings"
	"testing"
)

func TestSummarize(t *testing.T) {
	ev := func(action, pkg, test, output, at string) string {
		return `{"Time":"2026-12-02T06:00:` + at + `Z","Action":"` + action + `","Package":"` + pkg + `","Test":"` + test + `","Output":` + quote(output) + `}`
	}
	passing := []string{
		ev("start", "p/a", "", "", "00"),
		ev("run", "p/a", "TestOK", "", "00"),
		ev("output", "p/a", "TestOK", "=== RUN   TestOK\n", "00"),
		ev("output", "p/a", "TestOK", "    a_test.go:9: a log line of a passing test\n", "00"),
		ev("pass", "p/a", "TestOK", "", "01"),
		ev("output", "p/a", "TestBoot", "=== RUN   TestBoot\n", "01"),
		ev("output", "p/a", "TestBoot", "    helpers.go:65: boots a real guest (SBX_E2E=1)\n", "01"),
		ev("output", "p/a", "TestBoot", "--- SKIP: TestBoot (0.00s)\n", "01"),
		ev("skip", "p/a", "TestBoot", "", "01"),
		ev("output", "p/a", "", "PASS\n", "02"),
		ev("output", "p/a", "", "ok  \tp/a\t2.0s\n", "02"),
		ev("pass", "p/a", "", "", "02"),
		ev("output", "p/b", "TestBoot2", "    b_test.go:3: boots a real guest (SBX_E2E=1)\n", "03"),
		ev("skip", "p/b", "TestBoot2", "", "03"),
		ev("output", "p/b", "TestNoReason", "--- SKIP: TestNoReason (0.00s)\n", "03"),
		ev("skip", "p/b", "TestNoReason", "", "03"),
		ev("output", "p/b", "", "ok  \tp/b\t1.0s\n", "04"),
		ev("pass", "p/b", "", "", "04"),
	}
	failing := append(clone(passing), // a failed test's output is shown, and the exit is 1
		ev("output", "p/c", "TestBad", "=== RUN   TestBad\n", "05"),
		ev("output", "p/c", "TestBad", "    c_test.go:7: got 1, want 2\n", "05"),
		ev("fail", "p/c", "TestBad", "", "05"),
		ev("output", "p/c", "", "FAIL\tp/c\t0.1s\n", "06"),
		ev("fail", "p/c", "", "", "06"),
	)
	for _, tc := range []struct {
		name    string
		in      []string
		code    int
		want    []string
		notWant []string
	}{
		{"passing with skips", passing, 0, []string{
			"ok  \tp/a\t2.0s\n", "ok  \tp/b\t1.0s\n",
			"skipped (3 tests):\n  (no reason given)\n    p/b: TestNoReason\n  boots a real guest (SBX_E2E=1)\n    p/a: TestBoot\n    p/b: TestBoot2\n",
			"2 packages (0 failed): 1 tests passed, 3 skipped, 0 failed in 4s\n",
		}, []string{"a log line of a passing test", "PASS\n"}},
		{"a failure", failing, 1, []string{"    c_test.go:7: got 1, want 2\n", "FAIL\tp/c\t0.1s\n", "3 packages (1 failed): 1 tests passed, 3 skipped, 1 failed in 6s\n"}, nil},
		{"a build error passes through", []string{"# p/d\nd.go:1: syntax error", ev("output", "p/d", "", "FAIL\tp/d [build failed]\n", "00"), ev("fail", "p/d", "", "", "00")}, 1,
			[]string{"d.go:1: syntax error\n", "FAIL\tp/d [build failed]\n"}, nil},
		{"a build error as events (Go 1.24 on)", []string{`{"ImportPath":"p/e","Action":"build-output","Output":"e.go:2:1: undefined: x\n"}`, ev("output", "p/e", "", "FAIL\tp/e [build failed]\n", "00"), ev("fail", "p/e", "", "", "00")}, 1,
			[]string{"e.go:2:1: undefined: x\n", "FAIL\tp/e [build failed]\n"}, nil},
		{"a binary killed mid-test shows the test's output", []string{
			ev("output", "p/f", "TestHangs", "=== RUN   TestHangs\n", "00"),
			ev("output", "p/f", "TestHangs", "    f_test.go:4: waiting for the guest\n", "00"),
			ev("output", "p/f", "", "panic: test timed out after 14m0s\n", "01"),
			ev("output", "p/f", "", "FAIL\tp/f\t840.0s\n", "01"),
			ev("fail", "p/f", "", "", "01"),
		}, 1, []string{"panic: test timed out", "--- unfinished: TestHangs\n", "f_test.go:4: waiting for the guest\n"}, nil},
		{"no result", nil, 1, []string{"no package result"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			code := summarize(strings.NewReader(strings.Join(tc.in, "\n")), &out)
			if code != tc.code {
				t.Errorf("exit %d, want %d", code, tc.code)
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(out.String(), w) {
					t.Errorf("output has %q:\n%s", w, out.String())
				}
			}
		})
	}
}

func clone(s []string) []string { return append([]string(nil), s...) }

func quote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`, "\t", `\t`)
	return `"` + r.Replace(s) + `"`
}
