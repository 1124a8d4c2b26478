"""The harness's ports stay clear of the ranges other processes bind from."""

import socket

from tests.harness.ports import _ephemeral_range, reserve_ports


def test_reserved_ports_are_distinct_free_and_outside_ray_and_ephemeral_ranges():
    lo, hi = _ephemeral_range()
    first = reserve_ports(20)
    second = reserve_ports(20)
    ports = first + second
    assert len(set(ports)) == 40  # never handed out twice by one process
    for port in ports:
        assert not lo <= port <= hi, port  # where port-0 binds (Ray's GCS, raylet, ...) land
        assert not 10002 <= port <= 29999, port  # Ray's default worker ports and ray_cluster's
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_bound_port_is_not_handed_out():
    held = []
    try:
        for port in reserve_ports(5):
            s = socket.socket()
            s.bind(("127.0.0.1", port))
            held.append(s)
        busy = {s.getsockname()[1] for s in held}
        assert not busy & set(reserve_ports(50))
    finally:
        for s in held:
            s.close()
