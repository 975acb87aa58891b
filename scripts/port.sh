# Sourced by the scripts that start a server of their own on a loopback port
# (bench.sh, bench-instr.sh).

# free_port FIRST LAST prints the first port in FIRST..LAST that nothing on
# 127.0.0.1 accepts connections on; it returns 1 when every one does.
free_port() {
  local p
  for p in $(seq "$1" "$2"); do
    if ! timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$p" 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  return 1
}
