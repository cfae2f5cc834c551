// Package e2e is the end-to-end suite of the use cases in app: a real
// daemon with its embedded broker, real stores and real hosts on loopback,
// driven only through app's exported API. The tests of app's unexported
// parts (rules, plan helpers) stay in package app.
package e2e
