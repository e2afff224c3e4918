//go:build race

package limiter

const raceEnabled = true
