# Runs elasticrun ("$@" are its arguments) as a child, forwarding SIGTERM/SIGINT to it. A failed
# job exits with elasticrun's status; a finished one (status 0) idles until the pod is deleted,
# because a StatefulSet would otherwise restart it and the restarted agent would find the
# rendezvous closed.
child=
stopping=0
trap 'stopping=1; if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null; fi' TERM INT
elasticrun "$@" &
child=$!
if [ "$stopping" -eq 1 ]; then kill -TERM "$child" 2>/dev/null; fi
status=
while [ -z "$status" ]; do
  wait "$child"
  code=$?
  if ! kill -0 "$child" 2>/dev/null; then status=$code; fi
done
if [ "$status" -ne 0 ] || [ "$stopping" -eq 1 ]; then exit "$status"; fi
echo "elasticrun finished with status 0; idling so the StatefulSet does not restart the finished job (helm uninstall the release to remove it)."
idle=
trap 'if [ -n "$idle" ]; then kill "$idle" 2>/dev/null; fi; exit 0' TERM INT
while :; do
  sleep 3600 &
  idle=$!
  wait "$idle"
done
