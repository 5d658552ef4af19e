#!/bin/sh
# The README's first C block must be examples/quickstart.c, word for word:
# the snippet a newcomer copies is the one the suite compiles and runs.
readme=$1 source=$2
awk '/^```c$/ { inside = 1; next } /^```$/ && inside { exit } inside' \
	"$readme" | diff -u "$source" - && echo "README quick start matches $source"
