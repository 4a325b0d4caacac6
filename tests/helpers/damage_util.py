"""Damaging real TFRecord files for tests: flip a byte inside one record's payload."""

import struct

FRAMING_BYTES = 16  # length (8) + its CRC (4) before the data, the data's CRC (4) after it


def record_offsets(path):
    """(start, payload length) of every record of an uncompressed TFRecord file."""
    with open(path, "rb") as stream:
        data = stream.read()
    offsets, position = [], 0
    while position < len(data):
        (length,) = struct.unpack("<Q", data[position:position + 8])
        offsets.append((position, length))
        position += length + FRAMING_BYTES
    return offsets


def damage_payload(path, record):
    """Flips a byte in the middle of one record's payload; returns the record's start offset.

    TensorFlow then reports "corrupted record at START + 12" (the data's offset).
    """
    start, length = record_offsets(path)[record]
    with open(path, "rb") as stream:
        data = bytearray(stream.read())
    data[start + 12 + length // 2] ^= 0xFF
    with open(path, "wb") as stream:
        stream.write(bytes(data))
    return start
