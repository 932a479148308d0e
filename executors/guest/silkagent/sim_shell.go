package silkagent

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/sbxlog/sbxlog/executors/guest/silkd"
)

// The simulated guest's sessions and terminals. A session is a simulated
// shell over the guest's MemFS: its builtins cd, pwd, export, unset and
// exit, eval of shell text (words, '' and "" quotes, \ escapes, $NAME,
// ${NAME} and $? expansion, commands joined by ;, newlines, && and ||),
// and SimCommands for everything else, with the session's cwd (cat reads
// relative paths from it). A command the simulation does not have prints
// "sh: <cmd>: not found (<Name> simulates the guest ...)" and exits 127.
// There are no terminals: pty_open is unimplemented, saying so.

// SpawnPty implements PtySpawner: the simulated guest has no terminals.
func (s *SimSpawner) SpawnPty(*silkd.PtyOpen) (Pty, error) {
	return nil, silkd.Errorf(silkd.KindUnimplemented, "pty_open: %s simulates the guest and has no terminals", s.Name)
}

// StartShell implements ShellSpawner.
func (s *SimSpawner) StartShell(cwd string, env map[string]string) (Shell, error) {
	if cwd == "" {
		cwd = "/"
	}
	if st, err := s.FS.Stat(cwd); err != nil || st.Kind != silkd.FileDir {
		return nil, badRequest("session_create: cwd %s: no such directory in the simulated guest", cwd)
	}
	vars := map[string]string{"PATH": DefaultPath, "HOME": "/root"}
	for k, v := range env {
		vars[k] = v
	}
	return &simShell{sp: s, cwd: cwd, vars: vars}, nil
}

type simShell struct {
	sp   *SimSpawner
	cwd  string
	vars map[string]string
	last int32

	mu     sync.Mutex
	cur    *simProc
	closed bool
}

var errSimShellExited = errors.New("the shell exited")

// Run implements Shell.
func (sh *simShell) Run(argv []string, out func([]byte), interrupt <-chan struct{}) (int32, error) {
	sh.mu.Lock()
	closed := sh.closed
	sh.mu.Unlock()
	if closed {
		return 0, errSimShellExited
	}
	cmds := []simCmd{{words: argv}}
	if argv[0] == "eval" {
		var err error
		if cmds, err = simParse(strings.Join(argv[1:], " "), sh.lookup); err != nil {
			out([]byte("sh: syntax error: " + err.Error() + "\n"))
			sh.last = 2
			return 2, nil
		}
	}
	for _, c := range cmds {
		if (c.sep == "&&" && sh.last != 0) || (c.sep == "||" && sh.last == 0) || len(c.words) == 0 {
			continue
		}
		code, err := sh.one(c.words, out, interrupt)
		if err != nil {
			return code, err
		}
		sh.last = code
	}
	return sh.last, nil
}

func (sh *simShell) lookup(name string) string {
	if name == "?" {
		return strconv.Itoa(int(sh.last))
	}
	return sh.vars[name]
}

func (sh *simShell) abs(p string) string {
	if path.IsAbs(p) {
		return path.Clean(p)
	}
	return path.Join(sh.cwd, p)
}

// one runs one simple command.
func (sh *simShell) one(words []string, out func([]byte), interrupt <-chan struct{}) (int32, error) {
	say := func(format string, args ...any) { out([]byte(fmt.Sprintf(format, args...))) }
	args := words[1:]
	switch words[0] {
	case "cd":
		dir := sh.vars["HOME"]
		if len(args) > 0 {
			dir = args[0]
		}
		dir = sh.abs(dir)
		if st, err := sh.sp.FS.Stat(dir); err != nil || st.Kind != silkd.FileDir {
			say("sh: cd: can't cd to %s\n", args[0])
			return 1, nil
		}
		sh.cwd = dir
		return 0, nil
	case "pwd":
		say("%s\n", sh.cwd)
		return 0, nil
	case "export":
		for _, a := range args {
			if k, v, ok := strings.Cut(a, "="); ok {
				sh.vars[k] = v
			}
		}
		return 0, nil
	case "unset":
		for _, a := range args {
			delete(sh.vars, a)
		}
		return 0, nil
	case "exit":
		sh.Close()
		return 0, errSimShellExited
	case "cat":
		rel := make([]string, len(args))
		for i, a := range args {
			rel[i] = sh.abs(a)
		}
		words = append([]string{"cat"}, rel...)
	}
	run, err := sh.sp.command(words)
	if err != nil {
		var se *silkd.Error
		if errors.As(err, &se) && strings.Contains(se.Message, "simulates the guest") {
			say("sh: %s: not found (%s)\n", words[0], se.Message)
			return 127, nil
		}
		say("sh: %s: %v\n", words[0], err)
		return 2, nil
	}
	p := startSimProc(0, run)
	_ = p.inW.Close() // a session command's stdin is empty
	sh.mu.Lock()
	sh.cur = p
	closed := sh.closed
	sh.mu.Unlock()
	if closed {
		_ = p.Signal(syscall.SIGKILL)
	}
	stop := make(chan struct{})
	go func() {
		select {
		case <-interrupt:
			_ = p.Signal(syscall.SIGKILL)
		case <-stop:
		}
	}()
	var wg sync.WaitGroup
	var outMu sync.Mutex
	for _, r := range []io.Reader{p.outR, p.errR} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, silkd.OutputChunk)
			for {
				n, err := r.Read(buf)
				if n > 0 {
					outMu.Lock()
					out(buf[:n])
					outMu.Unlock()
				}
				if err != nil {
					return
				}
			}
		}()
	}
	code := p.Wait()
	wg.Wait()
	close(stop)
	sh.mu.Lock()
	sh.cur = nil
	closed = sh.closed
	sh.mu.Unlock()
	if closed {
		return code, errSimShellExited
	}
	if code == -1 {
		code = 128 + int32(syscall.SIGKILL) // as a shell reports a killed command
	}
	return code, nil
}

// Close implements Shell.
func (sh *simShell) Close() {
	sh.mu.Lock()
	sh.closed = true
	cur := sh.cur
	sh.mu.Unlock()
	if cur != nil {
		_ = cur.Signal(syscall.SIGKILL)
	}
}

// simCmd is one simple command of shell text and how it is joined to the
// one before ("", ";", "&&" or "||").
type simCmd struct {
	sep   string
	words []string
}

// simParse splits shell text into simple commands of expanded words.
func simParse(text string, lookup func(string) string) ([]simCmd, error) {
	var cmds []simCmd
	cur := simCmd{}
	var word strings.Builder
	inWord := false
	endWord := func() {
		if inWord {
			cur.words = append(cur.words, word.String())
			word.Reset()
			inWord = false
		}
	}
	endCmd := func(sep string) {
		endWord()
		cmds = append(cmds, cur)
		cur = simCmd{sep: sep}
	}
	isName := func(c byte, first bool) bool {
		return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (!first && c >= '0' && c <= '9')
	}
	// expand reads a $ expansion at text[i] (the $) and returns the index
	// after it.
	expand := func(i int) int {
		inWord = true
		j := i + 1
		switch {
		case j < len(text) && text[j] == '?':
			word.WriteString(lookup("?"))
			return j + 1
		case j < len(text) && text[j] == '{':
			if k := strings.IndexByte(text[j:], '}'); k > 0 {
				word.WriteString(lookup(text[j+1 : j+k]))
				return j + k + 1
			}
		case j < len(text) && isName(text[j], true):
			k := j
			for k < len(text) && isName(text[k], false) {
				k++
			}
			word.WriteString(lookup(text[j:k]))
			return k
		}
		word.WriteByte('$')
		return j
	}
	for i := 0; i < len(text); {
		c := text[i]
		switch {
		case c == ' ' || c == '\t':
			endWord()
			i++
		case c == ';' || c == '\n':
			endCmd(";")
			i++
		case strings.HasPrefix(text[i:], "&&"), strings.HasPrefix(text[i:], "||"):
			endCmd(text[i : i+2])
			i += 2
		case c == '\\' && i+1 < len(text):
			inWord = true
			word.WriteByte(text[i+1])
			i += 2
		case c == '\'':
			k := strings.IndexByte(text[i+1:], '\'')
			if k < 0 {
				return nil, errors.New("unterminated quoted string")
			}
			inWord = true
			word.WriteString(text[i+1 : i+1+k])
			i += k + 2
		case c == '"':
			inWord = true
			i++
			for i < len(text) && text[i] != '"' {
				switch {
				case text[i] == '$':
					i = expand(i)
				case text[i] == '\\' && i+1 < len(text) && strings.IndexByte(`$"\`, text[i+1]) >= 0:
					word.WriteByte(text[i+1])
					i += 2
				default:
					word.WriteByte(text[i])
					i++
				}
			}
			if i >= len(text) {
				return nil, errors.New("unterminated quoted string")
			}
			i++
		case c == '$':
			i = expand(i)
		default:
			inWord = true
			word.WriteByte(c)
			i++
		}
	}
	endCmd("")
	return cmds, nil
}

// SimSession is a simulated session as a snapshot keeps it: a real guest's
// sessions live in its memory, which a snapshot keeps, so the simulated
// guest's must come through a hibernate too.
type SimSession struct {
	ID  string            `json:"id"`
	Cwd string            `json:"cwd"`
	Env map[string]string `json:"env,omitempty"`
}

// SimSessions returns the simulated sessions of s, by id (none unless its
// Procs is a *SimSpawner). A command running in one is not kept: it is
// lost as the snapshot's connections are.
func (s *Server) SimSessions() []SimSession {
	s.init()
	t := &s.sessions
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []SimSession
	for id, sess := range t.m {
		if sh, ok := sess.sh.(*simShell); ok {
			out = append(out, SimSession{ID: id, Cwd: sh.cwd, Env: maps.Clone(sh.vars)})
		}
	}
	slices.SortFunc(out, func(a, b SimSession) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// RestoreSimSessions recreates sessions saved by SimSessions in s, whose
// Procs must be a *SimSpawner (else it does nothing).
func (s *Server) RestoreSimSessions(saved []SimSession) {
	sp, ok := s.Procs.(*SimSpawner)
	if !ok {
		return
	}
	s.init()
	t := &s.sessions
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, ss := range saved {
		t.m[ss.ID] = &session{sh: &simShell{sp: sp, cwd: ss.Cwd, vars: maps.Clone(ss.Env)},
			busy: make(chan struct{}, 1), used: s.now()}
	}
}
