#!/usr/bin/env python3
"""Checks a safetensors file written by `ampdist ckpt export` against the checkpoint it came from.

    check_safetensors.py FILE CHECKPOINT_DIR

FILE is loaded with the `safetensors` package (safetensors.numpy.load_file). The master weights are read
independently of ampdist: the shard files (CHECKPOINT_DIR/shard_*.pb) are parsed here by hand. Each is a sequence of
varint-length-prefixed ShardRecord messages (proto/ampdist/checkpoint.proto: 1 run_id, 2 buffer, 3 offset,
4 count, 5 data, 6 xxh3). The records of buffer "master" together make the flat FP32 master buffer, whose tensors lie
back to back in the manifest's order from element 0, which is the order of the exported file. So the exported
tensors, concatenated in header order, must equal the master buffer bit for bit.

Prints one line and exits 0 when everything holds; otherwise prints "FAIL: ..." and exits 1.
"""
import glob
import json
import os
import struct
import sys

EXPECTED = [
    ("fc1.weight", [512, 784]),
    ("fc1.bias", [512]),
    ("fc2.weight", [256, 512]),
    ("fc2.bias", [256]),
    ("fc3.weight", [10, 256]),
    ("fc3.bias", [10]),
]


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def varint(buf, pos):
    value, shift = 0, 0
    while True:
        check(pos < len(buf), "varint runs past the end of the data")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        check(shift < 64, "varint longer than 10 bytes")


def parse_message(buf):
    """Fields of one protobuf message: {field number: [values]} (bytes for length-delimited, int otherwise)."""
    fields, pos = {}, 0
    while pos < len(buf):
        key, pos = varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = varint(buf, pos)
        elif wire == 1:
            value, pos = struct.unpack_from("<Q", buf, pos)[0], pos + 8
        elif wire == 2:
            n, pos = varint(buf, pos)
            check(pos + n <= len(buf), f"field {number} runs past the end of its message")
            value, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            value, pos = struct.unpack_from("<I", buf, pos)[0], pos + 4
        else:
            raise Fail(f"unsupported wire type {wire} (field {number})")
        fields.setdefault(number, []).append(value)
    return fields


def read_master(ckpt_dir):
    """The master buffer (bytes) and the run ids of the shard records."""
    shards = sorted(glob.glob(os.path.join(ckpt_dir, "shard_*.pb")))
    check(shards, f"no shard_*.pb in {ckpt_dir}")
    pieces, run_ids = [], set()
    for path in shards:
        data = open(path, "rb").read()
        pos = 0
        while pos < len(data):
            n, pos = varint(data, pos)
            check(pos + n <= len(data), f"{path}: record at byte {pos} runs past the end of the file")
            rec = parse_message(data[pos:pos + n])
            pos += n
            run_ids.add(rec.get(1, [b""])[0].decode())
            if rec.get(2, [b""])[0] != b"master":
                continue
            offset, count, payload = rec.get(3, [0])[0], rec.get(4, [0])[0], rec.get(5, [b""])[0]
            check(len(payload) == 4 * count, f"{path}: record of {count} elements has {len(payload)} bytes")
            pieces.append((offset, count, payload))
    pieces.sort()
    master, expect = bytearray(), 0
    for offset, count, payload in pieces:
        check(offset == expect, f"master records leave a gap or overlap at element {expect} (next at {offset})")
        master += payload
        expect += count
    return bytes(master), run_ids


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    path, ckpt_dir = sys.argv[1], sys.argv[2]
    try:
        import numpy as np
        import safetensors.numpy
    except ImportError as e:
        print(f"FAIL: {sys.executable} cannot import safetensors.numpy and numpy ({e}); "
              "install them with launch/setup/install_deps.sh")
        return 1
    try:
        # The header, read by hand for its order and layout.
        raw = open(path, "rb").read()
        check(len(raw) >= 8, f"{path}: {len(raw)} bytes, shorter than the header length")
        (n,) = struct.unpack_from("<Q", raw, 0)
        check(n % 8 == 0, f"header length {n} is not a multiple of 8")
        header = json.loads(raw[8:8 + n].decode("utf-8"))
        data = raw[8 + n:]
        meta = header.pop("__metadata__", None)
        check(isinstance(meta, dict), "no __metadata__")
        check(meta.get("format") == "pt", f"metadata format {meta.get('format')!r}, expected 'pt'")
        step = int(os.path.basename(os.path.normpath(ckpt_dir)).removeprefix("step_"))
        check(meta.get("step") == str(step), f"metadata step {meta.get('step')!r}, the checkpoint is step {step}")
        got = [(name, entry["shape"]) for name, entry in header.items()]
        check(got == EXPECTED, f"tensors in the header {got}, expected {EXPECTED}")
        end = 0
        for name, entry in header.items():
            check(entry["dtype"] == "F32", f"{name}: dtype {entry['dtype']}, expected F32")
            begin, stop = entry["data_offsets"]
            check(begin == end, f"{name}: data begins at {begin}, expected {end} (back to back)")
            end = stop
        check(end == len(data), f"data section of {len(data)} bytes, the header covers {end}")

        # The file through the safetensors package.
        tensors = safetensors.numpy.load_file(path)
        check(sorted(tensors) == sorted(name for name, _ in EXPECTED), f"load_file gave {sorted(tensors)}")
        for name, shape in EXPECTED:
            t = tensors[name]
            check(t.dtype == np.float32, f"{name}: dtype {t.dtype}, expected float32")
            check(list(t.shape) == shape, f"{name}: shape {list(t.shape)}, expected {shape}")

        # Against the master weights read from the shards.
        master, run_ids = read_master(ckpt_dir)
        check(run_ids == {meta.get("run_id")}, f"metadata run_id {meta.get('run_id')!r}, shards say {run_ids}")
        flat = np.concatenate([tensors[name].reshape(-1) for name in header])
        check(flat.size * 4 == len(master), f"{flat.size} exported elements, the master buffer has {len(master) // 4}")
        if flat.astype("<f4").tobytes() != master:
            ref = np.frombuffer(master, dtype="<f4")
            bad = np.flatnonzero(flat.view(np.uint32) != ref.view(np.uint32))
            raise Fail(f"{bad.size} elements differ from the master weights, first at element {bad[0]}: "
                       f"{flat[bad[0]]!r} != {ref[bad[0]]!r}")
        check(data == master, "the raw data section differs from the master buffer")
    except Fail as e:
        print(f"FAIL: {path}: {e}")
        return 1
    except (OSError, ValueError, KeyError, TypeError, struct.error) as e:
        print(f"FAIL: {path}: {type(e).__name__}: {e}")
        return 1
    print(f"ok: {path}: {len(EXPECTED)} float32 tensors, {flat.size} elements, bitwise equal to the master weights "
          f"in {ckpt_dir} (step {step}, run {meta['run_id']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
