package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// megabyte is the MB of the table and of -rss-target and -rss-cap.
const megabyte = 1_000_000

// row is one attack's line of the table, and the targets it missed.
type row struct {
	attack string
	did    string // what the attackers did
	result string // what they got
	// proc is the process attacked (a daemon, or a child of this program);
	// nil for an attack on this process.
	proc *procStats
	// legit is the legitimate client's record; nil when there was none.
	legit  *legitStats
	misses []string
}

// miss records a target missed.
func (r *row) miss(format string, a ...any) { r.misses = append(r.misses, fmt.Sprintf(format, a...)) }

// verdict says whether the row met its targets.
func (r *row) verdict() string {
	if len(r.misses) == 0 {
		return "met"
	}
	return "missed: " + strings.Join(r.misses, "; ")
}

// judge records the targets that every attack shares: the process
// attacked stayed below the RSS target and alive, and the legitimate
// client had every check answered.
func (r *row) judge(c *config) {
	if p := r.proc; p != nil {
		switch {
		case p.killed:
			r.miss("%s passed -rss-cap (%d MB) and was killed", p.what, c.rssCap/megabyte)
		case p.peak >= c.rssTarget:
			r.miss("peak RSS %s", mb(p.peak))
		}
		if p.died != "" {
			r.miss("%s %s", p.what, p.died)
		}
	}
	if l := r.legit; l != nil {
		switch {
		case l.total == 0:
			r.miss("no legitimate check ran")
		case l.answered < l.total:
			r.miss("%d legitimate checks unanswered", l.total-l.answered)
		}
	}
}

func mb(b int64) string { return fmt.Sprintf("%.0f MB", float64(b)/megabyte) }

// size formats a size of b bytes: "2.0 MB", "20 KB".
func size(b int64) string {
	if b < megabyte {
		return fmt.Sprintf("%d KB", (b+500)/1000)
	}
	return fmt.Sprintf("%.1f MB", float64(b)/megabyte)
}

// writeTable writes rows as a markdown table.
func writeTable(w io.Writer, rows []*row, c *config) {
	fmt.Fprintln(w, "| attack | what the attacker did | result for the attacker | daemon peak RSS | legit checks answered/total, worst latency | target |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- |")
	for _, r := range rows {
		rss := "— (in this process)"
		if p := r.proc; p != nil {
			rss = mb(p.peak)
			if p.what != "daemon" {
				rss += " (" + p.what + ")"
			}
			if p.killed {
				rss = fmt.Sprintf("> %d MB (killed at -rss-cap)", c.rssCap/megabyte)
			}
		}
		legit := "—"
		if l := r.legit; l != nil {
			legit = l.String()
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n",
			cell(r.attack), cell(r.did), cell(r.result), cell(rss), cell(legit), cell(r.verdict()))
	}
}

// cell makes s fit in a markdown table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}

// ms formats d in milliseconds.
func ms(d time.Duration) string {
	switch {
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%d ms", d.Round(time.Millisecond).Milliseconds())
	case d >= 100*time.Microsecond:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}

// thousands formats n with commas: 1,500,000.
func thousands(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
