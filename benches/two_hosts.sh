# Sourced by the benchmarks that put two workers in network namespaces of their own, joined by a
# veth pair: NS, DEV and ADDR (two each) name the namespaces, their ends of the pair and their
# addresses; MTU, when set (say 9000, a data centre's jumbo frames), is the pair's MTU instead
# of veth's 1500. Needs root, `ip` and `tc`.

two_hosts_down() { for ns in "${NS[@]}"; do ip netns del "$ns" 2>/dev/null || true; done; }

# The two namespaces and the link between them, removed when the script exits.
two_hosts_up() {
  trap two_hosts_down EXIT
  two_hosts_down
  for i in 0 1; do ip netns add "${NS[$i]}"; done
  ip link add "${DEV[0]}" type veth peer name "${DEV[1]}"
  for i in 0 1; do
    ip link set "${DEV[$i]}" netns "${NS[$i]}"
    ip -n "${NS[$i]}" addr add "${ADDR[$i]}/24" dev "${DEV[$i]}"
    if [ -n "${MTU:-}" ]; then ip -n "${NS[$i]}" link set dev "${DEV[$i]}" mtu "$MTU"; fi
    ip -n "${NS[$i]}" link set "${DEV[$i]}" up
    ip -n "${NS[$i]}" link set lo up
  done
}

# Both ends of the link limited to RATE (`1gbit`, …) by a token bucket; `unlimited`: no limit.
tbf_limit() { # rate
  for i in 0 1; do
    tc -n "${NS[$i]}" qdisc del dev "${DEV[$i]}" root 2>/dev/null || true
    if [ "$1" != unlimited ]; then
      tc -n "${NS[$i]}" qdisc add dev "${DEV[$i]}" root tbf rate "$1" burst 256kb latency 100ms
    fi
  done
}

# The CPU time of two processes (GNU time's `%U %S %e` in files $1 and $2) over the longer
# one's wall time: how many of the machine's cores the pair kept busy.
cpu_cores() { # file file
  awk '{ cpu += $1 + $2; if ($3 > wall) wall = $3 } END { printf "%.2f", cpu / wall }' "$1" "$2"
}
