//go:build race

package fleetcap_test

const raceBuild = true
