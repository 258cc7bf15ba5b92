#!/bin/sh
# stage.sh NAME CMD...: runs CMD and prints how long it took, so that `make test`'s log
# (and CI's) says where the time goes. Exits with CMD's status.
name=$1
shift
t0=$(date +%s)
"$@"
rc=$?
echo "make test: $name took $(($(date +%s) - t0)) s${rc:+ (exit $rc)}" | sed 's/ (exit 0)$//'
exit $rc
