// Package rediskey names fleetcap's Redis keys. Every key a fleet owns
// starts with the fleet's prefix (config semaphore.prefix; DefaultPrefix
// when it sets none), so that fleets with different prefixes share one
// Redis without seeing each other's seats, overrides, tokens or idle
// workers:
//
//	<prefix>{<tag>}:holders, ...     a semaphore and its waiting room (package semaphore)
//	<prefix>wake:<id>                the pub/sub channel that wakes a waiting process (package semaphore)
//	<prefix>control                  the runtime overrides (package control; Control),
//	<prefix>control:changed          and the channel that announces a change
//	rate:<prefix>{<tag>}             a rate limit's tokens (package ratelimit; redis_rate
//	                                 puts "rate:" first)
//	<prefix>paced:{<tag>}:parked,... its waiting room, a paced room (package semaphore)
//	<prefix>rooms                    the rooms of rendered keys a producer noted (package
//	                                 semaphore)
//	<prefix>idle:{<queue tag>}:duty  the watch of an idle queue and its doorbell (internal/asynqx;
//	<prefix>idle:{<queue tag>}:bell  Idle)
//
// where <tag> is HashTag of the key, <queue tag> HashTag of the asynq
// queue's name. Two names stand apart from the fleets: fleetcap:layout
// (internal/layout), which records the layout for the whole Redis so that
// builds of different layouts find each other, and asynq's own keys
// (asynq:{<queue>}:...), which fleets that share a Redis keep apart by
// their queue names. Which names a build writes is its Redis layout:
// changing one bumps internal/layout's Version.
package rediskey

import (
	"fmt"
	"strings"
)

// DefaultPrefix starts the keys of a fleet whose config sets no
// semaphore.prefix, and those of the packages' defaults.
const DefaultPrefix = "fleetcap:sem:"

// tagEscaper percent-encodes "%" and "}": see HashTag.
var tagEscaper = strings.NewReplacer("%", "%25", "}", "%7D")

// HashTag is key as it stands between the braces of the hash tag of its
// Redis keys: "<prefix>{" + HashTag(key) + "}<suffix>". Redis Cluster
// hashes what stands between the first "{" of a name and the next "}", so
// the tag holds no "}": "}" becomes "%7D". "%" becomes "%25", so that two
// different keys never share an escaped form ("}" and "%7D" stay apart). A
// "{" stays as it is: inside the tag it changes nothing of the hashing.
// Every other key is its own tag, unchanged.
//
// key must not be empty: Redis hashes the whole name when the tag is
// empty ("{}"), so the names of one key would spread over slots; the
// callers refuse an empty key.
func HashTag(key string) string { return tagEscaper.Replace(key) }

// Control is the hash of the runtime overrides of the fleet of prefix.
func Control(prefix string) string { return prefix + "control" }

// Idle is the start of the names of the idle-dequeue keys of queue, in
// the fleet of prefix: Idle(prefix, queue) + "duty" and + "bell".
func Idle(prefix, queue string) string { return prefix + "idle:{" + HashTag(queue) + "}:" }

// CheckPrefix reports what is wrong with a fleet's prefix, in words that
// follow the prefix's name ("semaphore.prefix must not ..."): a "{" or
// "}" in it would make the prefix, not the key, the hash tag of its names.
func CheckPrefix(prefix string) error {
	if strings.ContainsAny(prefix, "{}") {
		return fmt.Errorf("must not contain \"{\" or \"}\" (they would break the keys' hash tag), got %q", prefix)
	}
	return nil
}

// PrefixOrDefault is the prefix a package of the fleet writes its keys
// under: prefix, or DefaultPrefix when it is empty; the error is
// CheckPrefix's.
func PrefixOrDefault(prefix string) (string, error) {
	if prefix == "" {
		return DefaultPrefix, nil
	}
	return prefix, CheckPrefix(prefix)
}
