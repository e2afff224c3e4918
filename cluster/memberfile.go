package cluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// The members a node has seen are kept in Config.DataDir, in
// membersFileName, so that a node that restarts rejoins them: a node that
// was the first of its cluster, started with no seeds, otherwise knows no
// one. The file is small JSON, replaced whole through a temporary file and
// a rename, so that a crash leaves the old list or the new one, and
// checked when read: anything but this format is refused.

// membersFileName is the file in Config.DataDir.
const membersFileName = "members.json"

// membersFormat names the file's format, so that a file of another kind
// is refused rather than misread.
const membersFormat = "sluice-members"

// membersFileVersion is the version of the file's format that this node
// writes. Version 2 adds each member's gRPC address; a version 1 file is
// still read, and its members are joined by gossip address alone.
const membersFileVersion = 2

// Bounds on what a members file may hold.
const (
	maxRememberedMembers = 256
	maxMembersFileBytes  = 256 << 10
	maxMemberNameBytes   = 512
)

// ErrMembersFile wraps the errors of a members file that cannot be read
// or is not one this version writes. New fails with it: remove the file
// to start without the members it named.
var ErrMembersFile = errors.New("cluster: bad members file")

// rememberedMember is a member as the file holds it.
type rememberedMember struct {
	Name   string `json:"name"`
	Gossip string `json:"gossip"`
	// GRPC is the member's gRPC address, where it is asked to prove
	// itself before it is joined again; empty in a version 1 file.
	GRPC string `json:"grpc,omitempty"`
}

type membersFile struct {
	Format  string             `json:"format"`
	Version int                `json:"version"`
	Members []rememberedMember `json:"members"`
}

// readMembersFile reads the members remembered in dir. A missing file is
// no members; any other failure wraps ErrMembersFile and names the file.
func readMembersFile(dir string) ([]rememberedMember, error) {
	path := filepath.Join(dir, membersFileName)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	bad := func(err error) error {
		return fmt.Errorf("%w %s: %w (remove it to start without remembered members)", ErrMembersFile, path, err)
	}
	if err != nil {
		return nil, bad(err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxMembersFileBytes+1))
	if err != nil {
		return nil, bad(err)
	}
	if len(b) > maxMembersFileBytes {
		return nil, bad(fmt.Errorf("larger than %d bytes", maxMembersFileBytes))
	}
	ms, err := parseMembersFile(b)
	if err != nil {
		return nil, bad(err)
	}
	return ms, nil
}

// parseMembersFile checks and decodes a members file's content.
func parseMembersFile(b []byte) ([]rememberedMember, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var mf membersFile
	if err := dec.Decode(&mf); err != nil {
		return nil, fmt.Errorf("not a members file: %w", err)
	}
	if dec.More() {
		return nil, errors.New("not a members file: data after the JSON object")
	}
	switch {
	case mf.Format != membersFormat:
		return nil, fmt.Errorf("format %q, want %q", mf.Format, membersFormat)
	case mf.Version != 1 && mf.Version != membersFileVersion:
		return nil, fmt.Errorf("version %d, this node reads 1 and %d", mf.Version, membersFileVersion)
	case len(mf.Members) > maxRememberedMembers:
		return nil, fmt.Errorf("%d members, at most %d", len(mf.Members), maxRememberedMembers)
	}
	for i, m := range mf.Members {
		if m.Name == "" || len(m.Name) > maxMemberNameBytes {
			return nil, fmt.Errorf("member %d: name must be 1 to %d bytes", i, maxMemberNameBytes)
		}
		if _, _, err := splitHostPort(m.Gossip); err != nil || strings.Contains(m.Gossip, "/") {
			return nil, fmt.Errorf("member %d (%s): gossip address %q is not host:port", i, m.Name, m.Gossip)
		}
		switch {
		case mf.Version == 1 && m.GRPC != "":
			return nil, fmt.Errorf("member %d (%s): a gRPC address in a version 1 file", i, m.Name)
		case mf.Version == 1:
		case len(m.GRPC) > maxMemberNameBytes || strings.Contains(m.GRPC, "/"):
			return nil, fmt.Errorf("member %d (%s): gRPC address %q is not host:port", i, m.Name, m.GRPC)
		default:
			if _, _, err := splitHostPort(m.GRPC); err != nil {
				return nil, fmt.Errorf("member %d (%s): gRPC address %q is not host:port", i, m.Name, m.GRPC)
			}
		}
	}
	return mf.Members, nil
}

// writeMembersFile replaces the members file in dir with ms, through a
// temporary file synced and renamed over it.
func writeMembersFile(dir string, ms []rememberedMember) error {
	b, err := json.MarshalIndent(membersFile{Format: membersFormat, Version: membersFileVersion, Members: ms}, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, membersFileName+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, membersFileName)); err != nil {
		return err
	}
	if d, err := os.Open(dir); err == nil { // the rename itself survives a crash
		d.Sync()
		d.Close()
	}
	return nil
}

// sameMembers reports whether a and b, both sorted by name, are equal.
func sameMembers(a, b []rememberedMember) bool { return slices.Equal(a, b) }
