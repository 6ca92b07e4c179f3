// Package rediskey is how fleetcap names its Redis keys after the key a
// user gave: the one escaper that turns any key string into a Redis Cluster
// hash tag, for the semaphores and the rate limits alike.
package rediskey

import "strings"

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
