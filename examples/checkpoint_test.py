# SPDX-License-Identifier: Apache-2.0
# Issue 11: fashion_mnist refuses a bad checkpoint (one flipped byte, an epoch count of 2^40,
# the old TUTTICK1 format) with exit 1 and a message naming the fault, and leaves it unchanged;
# with --elastic, a commit with more epochs done than --epochs likewise.
#
# Usage: python3 examples/checkpoint_test.py MPIEXEC build/examples/fashion_mnist
# Writes a tiny idx data set (64 training, 16 test images), saves a checkpoint with a 1-epoch
# run at 2 ranks, then damages copies of it. The checkpoint layout is fashion_mnist.cc's: magic
# (8 bytes), int64 epochs, ..., uint32 CRC-32 of everything before it.
import os
import struct
import subprocess
import sys
import tempfile
import zlib


def write_idx(directory, prefix, count):
    with open(os.path.join(directory, f"{prefix}-images-idx3-ubyte"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, count, 28, 28))
        f.write(bytes((i * 7 + j) % 256 for i in range(count) for j in range(28 * 28)))
    with open(os.path.join(directory, f"{prefix}-labels-idx1-ubyte"), "wb") as f:
        f.write(struct.pack(">II", 0x801, count) + bytes(i % 10 for i in range(count)))


def main(mpiexec, program):
    with tempfile.TemporaryDirectory() as tmp:
        write_idx(tmp, "train", 64)
        write_idx(tmp, "t10k", 16)
        checkpoint = os.path.join(tmp, "ck")

        def run(epochs):
            return subprocess.run([mpiexec, "-n", "2", "--oversubscribe", program, "--data-dir",
                                   tmp, "--epochs", str(epochs), "--batch-size", "8",
                                   "--checkpoint", checkpoint], capture_output=True, text=True,
                                  timeout=120)

        first = run(1)
        if first.returncode != 0:
            print("the 1-epoch run failed:\n" + first.stdout + first.stderr)
            return 1
        with open(checkpoint, "rb") as f:
            good = f.read()
        body = good[:-4]
        with_epochs = body[:8] + struct.pack("=q", 2**40) + body[16:]
        flipped = bytearray(good)
        flipped[len(good) // 2] ^= 0x01
        cases = [
            ("a flipped byte", bytes(flipped), "checksum mismatch"),
            ("2^40 epochs", with_epochs + struct.pack("=I", zlib.crc32(with_epochs)),
             "epoch count 1099511627776 outside 0 ... 2"),
            ("the old format", b"TUTTICK1" + good[8:], "old format TUTTICK1"),
            ("a truncated file", good[:len(good) // 3], "checksum mismatch"),
        ]
        failures = 0
        for what, data, message in cases:
            with open(checkpoint, "wb") as f:
                f.write(data)
            result = run(2)
            with open(checkpoint, "rb") as f:
                kept = f.read() == data
            if result.returncode != 1 or message not in result.stderr or not kept:
                failures += 1
                print(f"FAIL {what}: exit {result.returncode}, file kept: {kept}, expected "
                      f"'{message}' in stderr:\n{result.stderr}")
            else:
                print(f"ok   {what}: exit 1, '{message}'")
        # --elastic refuses a commit past --epochs as --checkpoint does (it used to print the
        # finished run's accuracy and exit 0, the smaller --epochs ignored).
        elastic_env = dict(os.environ, TUTTI_ELASTIC_DIR=os.path.join(tmp, "commits"))

        def run_elastic(epochs):
            return subprocess.run([mpiexec, "-n", "2", "--oversubscribe", program, "--data-dir",
                                   tmp, "--epochs", str(epochs), "--batch-size", "8",
                                   "--elastic"], capture_output=True, text=True, timeout=120,
                                  env=elastic_env)

        finished = run_elastic(2)
        fewer = run_elastic(1)
        message = "has 2 epochs done, more than --epochs 1"
        if finished.returncode != 0 or fewer.returncode != 1 or message not in fewer.stderr:
            failures += 1
            print(f"FAIL an elastic commit past --epochs: exits {finished.returncode} then "
                  f"{fewer.returncode}, expected 0 then 1 and '{message}' in stderr:\n"
                  f"{finished.stderr}{fewer.stdout}{fewer.stderr}")
        else:
            print(f"ok   an elastic commit past --epochs: exit 1, '{message}'")
        return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
