package keyspace

import "encoding/binary"

// Slots is the number of Redis Cluster hash slots.
const Slots = 16384

// crcTable is CRC16-XMODEM (polynomial 0x1021, initial value 0, no
// reflection), the checksum Redis Cluster hashes keys with, one byte at a
// time.
var crcTable = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

func crc16(b []byte) uint16 {
	var c uint16
	for _, x := range b {
		c = c<<8 ^ crcTable[byte(c>>8)^x]
	}
	return c
}

// HashTag returns the part of key that Redis Cluster hashes: the bytes
// between the first '{' and the first '}' after it, when there are any,
// otherwise the whole key. Keys that share a non-empty tag share a slot.
func HashTag(key []byte) []byte {
	for i, c := range key {
		if c != '{' {
			continue
		}
		for j := i + 1; j < len(key); j++ {
			if key[j] == '}' {
				if j == i+1 {
					return key // "{}": an empty tag hashes the whole key
				}
				return key[i+1 : j]
			}
		}
		return key // no '}' after the first '{'
	}
	return key
}

// Slot is the Redis Cluster hash slot of key, as CLUSTER KEYSLOT answers.
func Slot(key []byte) uint16 { return crc16(HashTag(key)) % Slots }

// Partitions is how many partitions Partition has: one per slot.
const Partitions = Slots

// Partition is the store's partition function (storage.Options.Partition,
// with Partitions): a record key's slot, so that each committer writes a
// range of slots, a transaction on the keys of one slot stays with one
// committer, and WATCH counts the writes of a slot
// (storage.Store.PartitionWrites). A key shorter than a slot is in
// partition 0; one whose first two bytes are no slot, in their value
// modulo Slots.
func Partition(k []byte) int {
	if len(k) < 2 {
		return 0
	}
	return int(binary.BigEndian.Uint16(k) % Slots)
}
