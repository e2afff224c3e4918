package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// procStats is what the watch of a process found.
type procStats struct {
	what string // "daemon", or what the child is
	// peak is the process's peak resident set in bytes: the largest VmHWM
	// read while it ran. (Its rusage's maxrss is no measure: Linux keeps
	// across exec the peak of the memory the child was forked with, which
	// is this program's.)
	peak int64
	// killed: its RSS passed the cap and it was killed.
	killed bool
	// died says how it exited on its own before it was stopped; "" when it
	// did not.
	died string
}

// proc is a child process whose memory is watched: its peak resident set
// is read from /proc while it runs, and it is killed when its RSS passes a
// cap.
type proc struct {
	cmd    *exec.Cmd
	what   string
	cap    int64         // bytes
	exited chan struct{} // closed once cmd.Wait has returned
	// watched is closed once the watch loop has returned, after exited.
	watched chan struct{}
	peak    atomic.Int64
	killed  atomic.Bool

	stopOnce sync.Once
	stats    procStats // set by stopOnce
}

// watchEvery is how often a process's memory is read.
const watchEvery = 20 * time.Millisecond

// startProc starts cmd and watches it.
func startProc(cmd *exec.Cmd, what string, cap int64) (*proc, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, what: what, cap: cap, exited: make(chan struct{}), watched: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(p.exited)
	}()
	go p.watch()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// watch reads the process's memory until it exits, killing it once its
// RSS passes the cap.
func (p *proc) watch() {
	defer close(p.watched)
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	for {
		p.read()
		select {
		case <-p.exited:
			return
		case <-t.C:
		}
	}
}

// read reads the process's memory, killing it when its RSS passes the
// cap.
func (p *proc) read() {
	hwm, rss, err := readMemory(p.pid())
	if err != nil {
		return // exited
	}
	p.raise(hwm)
	if rss > p.cap && !p.killed.Swap(true) {
		p.cmd.Process.Kill()
	}
}

// raise makes peak at least b.
func (p *proc) raise(b int64) { atomicMax(&p.peak, b) }

// atomicMax makes a at least v.
func atomicMax(a *atomic.Int64, v int64) {
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}

// stop ends the process, SIGTERM then SIGKILL after grace, and returns
// what the watch found. A process that had exited already died, unless
// the watch killed it. Later calls return the first call's result.
func (p *proc) stop(grace time.Duration) *procStats {
	return p.end(true, grace, "")
}

// await waits up to timeout for the process to exit on its own, killing it
// then, and returns what the watch found.
func (p *proc) await(timeout time.Duration) *procStats {
	return p.end(false, timeout, fmt.Sprintf("did not finish within %v", timeout))
}

// end ends the process once: with SIGTERM when term is set, then waiting
// up to wait for it to exit before killing it, which makes it died late.
func (p *proc) end(term bool, wait time.Duration, late string) *procStats {
	p.stopOnce.Do(func() {
		died := ""
		select {
		case <-p.exited:
			if term {
				died = "exited during the attack (" + p.cmd.ProcessState.String() + ")"
			}
		default:
			if term {
				p.read() // the peak of the attack, whatever the stop costs
				p.cmd.Process.Signal(syscall.SIGTERM)
			}
			t := time.NewTimer(wait)
			select {
			case <-p.exited:
			case <-t.C:
				p.cmd.Process.Kill()
				<-p.exited
				died = late
			}
			t.Stop()
		}
		p.stats = p.finish(died)
	})
	return &p.stats
}

// finish completes the stats of an exited process.
func (p *proc) finish(died string) procStats {
	<-p.watched
	killed := p.killed.Load()
	if killed {
		died = ""
	}
	return procStats{what: p.what, peak: p.peak.Load(), killed: killed, died: died}
}

// readMemory returns the peak (VmHWM) and current (VmRSS) resident set of
// process pid, in bytes.
func readMemory(pid int) (hwm, rss int64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0, err
	}
	var found int
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != "VmHWM" && name != "VmRSS" {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/%d/status: %s: %w", pid, name, err)
		}
		if name == "VmHWM" {
			hwm = kb << 10
		} else {
			rss = kb << 10
		}
		found++
	}
	if found < 2 {
		return 0, 0, errNoMemory
	}
	return hwm, rss, nil
}

// errNoMemory is a status without VmHWM and VmRSS: a zombie's.
var errNoMemory = errors.New("no VmHWM and VmRSS in /proc/<pid>/status")

// clockTick is the unit of the CPU times of /proc/<pid>/stat (USER_HZ,
// 100 on every Linux platform Go supports).
const clockTick = 10 * time.Millisecond

// readCPU returns the CPU time, user and system, that process pid has used.
func readCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: fields count
	// from the last ')'. utime and stime are the 14th and 15th fields.
	i := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[i+1:]))
	if i < 0 || len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return time.Duration(utime+stime) * clockTick, nil
}
