#!/usr/bin/env bash
# Builds each layering case (tests/layering/CMakeLists.txt) and checks that an upward include fails to compile
# because the header is not on that library's include path, and that the control case compiles.
#   bash check_layering.sh BUILD_DIR FILE:LIBRARY:HEADER...
set -u
build=$1
shift
failed=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if cmake --build "$build" --target layering_comm_includes_core >"$log" 2>&1; then
  echo "ok - control: comm/ including runtime/core/tensor.h compiles"
else
  echo "not ok - control: comm/ including runtime/core/tensor.h does not compile"; sed 's/^/    | /' "$log" | tail -20
  failed=1
fi
for c in "$@"; do
  IFS=: read -r file lib header <<<"$c"
  if cmake --build "$build" --target "layering_$file" >"$log" 2>&1; then
    echo "not ok - $file: $header compiled against $lib (an upward include the build must refuse)"
    failed=1
  elif grep -q "$header: No such file or directory" "$log"; then
    echo "ok - $file: $lib cannot see $header"
  else
    echo "not ok - $file: failed for another reason than the missing header"; sed 's/^/    | /' "$log" | tail -20
    failed=1
  fi
done
exit "$failed"
