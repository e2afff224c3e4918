package cluster

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/serf/serf"
)

func TestProtocolRangeParse(t *testing.T) {
	for _, tc := range []struct {
		name     string
		tags     map[string]string
		want     protocolRange
		wantErr  bool
		overlaps bool // with 1-1
	}{
		{"this build", map[string]string{"pmin": "1", "pmax": "1"}, protocolRange{1, 1}, false, true},
		{"next build speaks both", map[string]string{"pmin": "1", "pmax": "2"}, protocolRange{1, 2}, false, true},
		{"build after next", map[string]string{"pmin": "2", "pmax": "3"}, protocolRange{2, 3}, false, false},
		{"no tags (a stock agent)", map[string]string{"grpc": "127.0.0.1:1"}, protocolRange{}, true, false},
		{"empty range", map[string]string{"pmin": "3", "pmax": "2"}, protocolRange{}, true, false},
		{"version 0", map[string]string{"pmin": "0", "pmax": "1"}, protocolRange{}, true, false},
		{"beyond a byte", map[string]string{"pmin": "1", "pmax": "256"}, protocolRange{}, true, false},
		{"negative", map[string]string{"pmin": "-1", "pmax": "1"}, protocolRange{}, true, false},
		{"text", map[string]string{"pmin": "one", "pmax": "1"}, protocolRange{}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseProtocolTags(tc.tags)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("parse %v = %v, %v; want %v, error %v", tc.tags, got, err, tc.want, tc.wantErr)
			}
			if err == nil && got.overlaps(thisProtocol) != tc.overlaps {
				t.Fatalf("%v overlaps %v: %v, want %v", got, thisProtocol, !tc.overlaps, tc.overlaps)
			}
		})
	}
}

// versionMember is a serf member with a protocol range ("" leaves the
// tags out).
func versionMember(name, pmin, pmax string, status serf.MemberStatus) serf.Member {
	tags := map[string]string{grpcTag: "127.0.0.1:7947"}
	if pmin != "" {
		tags[protoMinTag], tags[protoMaxTag] = pmin, pmax
	}
	return serf.Member{Name: name, Addr: net.IPv4(127, 0, 0, 1), Port: 7946, Tags: tags, Status: status}
}

// TestVersionsSteps runs the protocol filter of a 1-2 node through a
// rolling upgrade and its mistakes: each step is the membership serf
// reports, the members that may enter the ring, those refused, and the
// changes reported (so logged) at that step, once each.
func TestVersionsSteps(t *testing.T) {
	alive, failed := serf.StatusAlive, serf.StatusFailed
	steps := []struct {
		what        string
		members     []serf.Member
		wantIn      []string
		wantRefused []string
		wantReports []string // "+name" refused, "-name" no longer
	}{
		{"old and new builds overlap", []serf.Member{versionMember("self", "", "", alive), versionMember("old", "1", "1", alive), versionMember("new", "1", "2", alive)},
			[]string{"self", "old", "new"}, nil, nil},
		{"a build that dropped 1 and 2", []serf.Member{versionMember("self", "", "", alive), versionMember("old", "1", "1", alive), versionMember("far", "3", "3", alive)},
			[]string{"self", "old"}, []string{"far"}, []string{"+far"}},
		{"refused again: no new report", []serf.Member{versionMember("self", "", "", alive), versionMember("old", "1", "1", alive), versionMember("far", "3", "3", alive)},
			[]string{"self", "old"}, []string{"far"}, nil},
		{"a stock agent without tags", []serf.Member{versionMember("self", "", "", alive), versionMember("far", "3", "3", alive), versionMember("agent", "", "", alive)},
			[]string{"self"}, []string{"agent", "far"}, []string{"+agent"}},
		{"far downgraded to overlap, agent failed", []serf.Member{versionMember("self", "", "", alive), versionMember("far", "2", "3", alive), versionMember("agent", "", "", failed)},
			[]string{"self", "far"}, nil, []string{"-agent", "-far"}},
		{"far's reason changes", []serf.Member{versionMember("self", "", "", alive), versionMember("far", "4", "4", alive)},
			[]string{"self"}, []string{"far"}, []string{"+far"}},
		{"and changes again", []serf.Member{versionMember("self", "", "", alive), versionMember("far", "5", "9", alive)},
			[]string{"self"}, []string{"far"}, []string{"+far"}},
	}
	v := newVersions(protocolRange{1, 2})
	now := time.Unix(1000, 0)
	for _, s := range steps {
		var reports []string
		in := v.filter(s.members, "self", now, func(m RefusedMember, refused bool) {
			if refused {
				reports = append(reports, "+"+m.Name)
			} else {
				reports = append(reports, "-"+m.Name)
			}
		})
		var names []string
		for _, m := range in {
			names = append(names, m.Name)
		}
		var refused []string
		for _, r := range v.list() {
			refused = append(refused, r.Name)
			if !strings.Contains(r.Reason, "protocol") {
				t.Errorf("%s: %s refused for %q, which does not name the protocol", s.what, r.Name, r.Reason)
			}
		}
		slices.Sort(reports)
		if !slices.Equal(names, s.wantIn) || !slices.Equal(refused, s.wantRefused) || !slices.Equal(reports, s.wantReports) {
			t.Fatalf("%s: in %v, refused %v, reports %v; want %v, %v, %v", s.what, names, refused, reports, s.wantIn, s.wantRefused, s.wantReports)
		}
	}
}

func TestMembersFileParse(t *testing.T) {
	good := `{"format":"sluice-members","version":1,"members":[{"name":"a","gossip":"10.0.0.1:7946"},{"name":"b","gossip":"[fd00::2]:7946"}]}`
	many := `{"format":"sluice-members","version":1,"members":[` + strings.Repeat(`{"name":"a","gossip":"10.0.0.1:7946"},`, maxRememberedMembers) + `{"name":"a","gossip":"10.0.0.1:7946"}]}`
	for _, tc := range []struct {
		name, text string
		want       int    // members, when it parses
		wantErr    string // part of the error, "" when it parses
	}{
		{"good", good, 2, ""},
		{"no members", `{"format":"sluice-members","version":1,"members":[]}`, 0, ""},
		{"truncated", good[:len(good)/2], 0, "not a members file"},
		{"empty", ``, 0, "not a members file"},
		{"foreign JSON", `{"nodes":["a"]}`, 0, "not a members file"},
		{"another format", `{"format":"sluice-state","version":1,"members":[]}`, 0, "format"},
		{"a later version", `{"format":"sluice-members","version":3,"members":[]}`, 0, "version 3"},
		{"version 2", `{"format":"sluice-members","version":2,"members":[{"name":"a","gossip":"10.0.0.1:7946","grpc":"10.0.0.1:7947"}]}`, 1, ""},
		{"version 2 without gRPC", `{"format":"sluice-members","version":2,"members":[{"name":"a","gossip":"10.0.0.1:7946"}]}`, 0, "gRPC address"},
		{"version 2, gRPC with no port", `{"format":"sluice-members","version":2,"members":[{"name":"a","gossip":"10.0.0.1:7946","grpc":"10.0.0.1"}]}`, 0, "gRPC address"},
		{"version 2, named gRPC", `{"format":"sluice-members","version":2,"members":[{"name":"a","gossip":"10.0.0.1:7946","grpc":"dns:///a:7947"}]}`, 0, "gRPC address"},
		{"version 2, long gRPC", `{"format":"sluice-members","version":2,"members":[{"name":"a","gossip":"10.0.0.1:7946","grpc":"` + strings.Repeat("h", maxMemberNameBytes) + `:1"}]}`, 0, "gRPC address"},
		{"version 1 with gRPC", `{"format":"sluice-members","version":1,"members":[{"name":"a","gossip":"10.0.0.1:7946","grpc":"10.0.0.1:7947"}]}`, 0, "version 1"},
		{"data after", good + `{}`, 0, "data after"},
		{"too many", many, 0, "at most"},
		{"no name", `{"format":"sluice-members","version":1,"members":[{"name":"","gossip":"10.0.0.1:7946"}]}`, 0, "name"},
		{"long name", `{"format":"sluice-members","version":1,"members":[{"name":"` + strings.Repeat("n", maxMemberNameBytes+1) + `","gossip":"10.0.0.1:7946"}]}`, 0, "name"},
		{"no port", `{"format":"sluice-members","version":1,"members":[{"name":"a","gossip":"10.0.0.1"}]}`, 0, "host:port"},
		{"named address", `{"format":"sluice-members","version":1,"members":[{"name":"a","gossip":"a/10.0.0.1:7946"}]}`, 0, "host:port"},
		{"binary", "\x00\x01\x02sluice", 0, "not a members file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms, err := parseMembersFile([]byte(tc.text))
			if tc.wantErr == "" {
				if err != nil || len(ms) != tc.want {
					t.Fatalf("parse: %d members, %v; want %d", len(ms), err, tc.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("parse: %v, want an error with %q", err, tc.wantErr)
			}
		})
	}
}

// A members file is replaced whole, leaves no temporary file behind, and
// reads back as written; a file too large, or not one, is refused with
// ErrMembersFile naming it; a missing file is no members.
func TestMembersFileRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if ms, err := readMembersFile(dir); err != nil || ms != nil {
		t.Fatalf("missing file: %v, %v", ms, err)
	}
	for _, want := range [][]rememberedMember{
		{{Name: "a", Gossip: "10.0.0.1:7946", GRPC: "10.0.0.1:7947"}},
		{{Name: "a", Gossip: "10.0.0.1:7946", GRPC: "10.0.0.1:7947"}, {Name: "b", Gossip: "10.0.0.2:7946", GRPC: "[fd00::2]:7947"}},
	} {
		if err := writeMembersFile(dir, want); err != nil {
			t.Fatal(err)
		}
		got, err := readMembersFile(dir)
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("read %v, %v; want %v", got, err, want)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("%d files in the data dir, want only %s", len(entries), membersFileName)
	}
	path := filepath.Join(dir, membersFileName)
	for name, text := range map[string]string{
		"too large": `{"format":"sluice-members","version":1,"members":[]}` + strings.Repeat(" ", maxMembersFileBytes),
		"foreign":   "PK\x03\x04 a zip file",
	} {
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := readMembersFile(dir)
		if !errors.Is(err, ErrMembersFile) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s file: %v, want ErrMembersFile naming %s", name, err, path)
		}
	}
}
