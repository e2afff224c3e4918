package main

import (
	"runtime"
	"runtime/debug"
	"strings"
)

// version returns one line: the module version (or "devel" for a build
// from a work tree), the commit with its time and whether the tree had
// changes, the Go version and the platform.
func (a *app) version() string {
	var bi *debug.BuildInfo
	if a.buildInfo != nil {
		bi, _ = a.buildInfo()
	}
	if bi == nil {
		return "sluice (no build information) " + runtime.GOOS + "/" + runtime.GOARCH
	}
	v := bi.Main.Version
	if v == "" || v == "(devel)" {
		v = "devel"
	}
	settings := make(map[string]string, len(bi.Settings))
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	parts := []string{"sluice", v}
	if rev := settings["vcs.revision"]; rev != "" {
		commit := "commit " + rev
		if t := settings["vcs.time"]; t != "" {
			commit += " " + t
		}
		if settings["vcs.modified"] == "true" {
			commit += " modified"
		}
		parts = append(parts, "("+commit+")")
	}
	platform := runtime.GOOS + "/" + runtime.GOARCH
	if goos, goarch := settings["GOOS"], settings["GOARCH"]; goos != "" && goarch != "" {
		platform = goos + "/" + goarch
	}
	goVersion := bi.GoVersion
	if goVersion == "" {
		goVersion = runtime.Version()
	}
	return strings.Join(append(parts, goVersion, platform), " ")
}
