# Used by benches/link_cpu_cost.sh.
# Both ends send and receive TOTAL bytes at once over one TCP connection, blocking I/O, 1 MiB
# writes and reads: the kernel's cost of moving the bytes, with no user-space spinning.
import socket, sys, threading, time, resource
role, host, port, total = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if role == "server":
    ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((host, port)); ls.listen(1); s, _ = ls.accept()
else:
    for _ in range(100):
        try:
            s = socket.create_connection((host, port)); break
        except OSError:
            time.sleep(0.05)
    else:
        sys.exit(f"no server at {host}:{port} after 5 s")
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
buf = bytearray(1 << 20)
def send():
    left = total
    mv = memoryview(buf)
    while left > 0:
        n = s.send(mv[: min(left, len(buf))]); left -= n
def recv():
    left = total; rb = bytearray(1 << 20)
    while left > 0:
        n = s.recv_into(rb, min(left, len(rb)))
        if n == 0: break
        left -= n
r0 = resource.getrusage(resource.RUSAGE_SELF); t0 = time.time()
t = threading.Thread(target=send); t.start(); recv(); t.join()
t1 = time.time(); r1 = resource.getrusage(resource.RUSAGE_SELF)
print(f"{role} bytes={total} wall={t1-t0:.3f} user={r1.ru_utime-r0.ru_utime:.3f} sys={r1.ru_stime-r0.ru_stime:.3f}")
