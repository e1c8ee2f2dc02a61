// Scan responses put back with the advertisement they answer (docs/esphome.md "Active
// scanning"). An ESP32 proxy hands Home Assistant one `BluetoothLERawAdvertisement` whose data
// is the advertising data followed by the scan response (its `data` holds 31 + 31 bytes), so
// Home Assistant reads a device's name from the scan response and its service data from the
// advertisement in one message. HCI delivers them as two reports (Core 5.4, Vol 4, Part E,
// §7.7.65.2: SCAN_RSP is its own Event_Type), so the proxy keeps the last scannable
// advertisement of a few devices and, when a scan response comes, sends the two together.
//
// Fixed memory, allocated once: `capacity` entries of address and up to 31 bytes. Only
// advertisements that can be answered (scannable, §4.4.3.2 of Vol 6, Part B) go in, and only
// while scanning actively; a passive scan costs nothing here. Entries are replaced oldest first:
// on air the scan response follows the advertisement by two inter-frame spaces (the scan request
// in between, 150 µs each: Vol 6, Part B, §4.4.3.2 and §4.1.1), so the entry it needs is among the
// most recent ones.

public struct ScanResponses: ~Copyable {
    /// Devices remembered at once. A scan response arrives within a millisecond of its
    /// advertisement; 32 cover the advertisements of a busy room heard in between.
    public static let capacity = 32
    /// Legacy advertising data: at most 31 bytes (Vol 3, Part C, §11).
    public static let dataLimit = 31

    /// Address with its type above bit 48 (the same address as public and random are two devices).
    var keys: [UInt64]
    var counts: [UInt8]
    let storage: UnsafeMutableRawBufferPointer
    /// Where the next new entry goes (round robin: the oldest is replaced).
    var next = 0
    /// Scan responses sent together with their advertisement, and alone (none was remembered).
    public private(set) var merged = 0
    public private(set) var alone = 0

    public init() {
        keys = Array(repeating: UInt64.max, count: Self.capacity)
        counts = Array(repeating: 0, count: Self.capacity)
        // Room for the entries, then one 62-byte merge buffer.
        storage = .allocate(byteCount: Self.capacity * Self.dataLimit + 2 * Self.dataLimit, alignment: 8)
        storage.initializeMemory(as: UInt8.self, repeating: 0)
    }

    deinit { storage.deallocate() }

    static func key(_ address: UInt64, _ type: UInt8) -> UInt64 { address & 0xFFFF_FFFF_FFFF | UInt64(type) << 48 }

    func find(_ key: UInt64) -> Int? {
        for i in 0..<Self.capacity where keys[i] == key { return i }
        return nil
    }

    /// A scannable advertisement: remembered (over the device's last one) for its scan response.
    public mutating func advertised(address: UInt64, addressType: UInt8, data: UnsafeRawBufferPointer) {
        guard data.count <= Self.dataLimit else { return }
        let k = Self.key(address, addressType)
        let i: Int
        if let found = find(k) { i = found } else {
            i = next
            next = next == Self.capacity - 1 ? 0 : next + 1
            keys[i] = k
        }
        counts[i] = UInt8(truncatingIfNeeded: data.count)
        if data.count > 0 {
            UnsafeMutableRawBufferPointer(rebasing: storage[i * Self.dataLimit..<i * Self.dataLimit + data.count])
                .copyMemory(from: data)
        }
    }

    /// A scan response: the device's last advertisement followed by it, or the scan response
    /// alone when no advertisement of that device is remembered. The bytes stay valid until the
    /// next call (they are this value's merge buffer, or `data`).
    public mutating func answered(address: UInt64, addressType: UInt8,
                                  data: UnsafeRawBufferPointer) -> UnsafeRawBufferPointer {
        guard data.count <= Self.dataLimit, let i = find(Self.key(address, addressType)) else {
            alone &+= 1
            return data
        }
        let n = Int(counts[i])
        let out = Self.capacity * Self.dataLimit
        UnsafeMutableRawBufferPointer(rebasing: storage[out..<out + n])
            .copyMemory(from: UnsafeRawBufferPointer(rebasing: storage[i * Self.dataLimit..<i * Self.dataLimit + n]))
        if data.count > 0 {
            UnsafeMutableRawBufferPointer(rebasing: storage[out + n..<out + n + data.count]).copyMemory(from: data)
        }
        merged &+= 1
        return UnsafeRawBufferPointer(rebasing: storage[out..<out + n + data.count])
    }

    /// Forgets every device: scanning went passive, no scan response will come.
    public mutating func clear() {
        for i in 0..<Self.capacity { keys[i] = UInt64.max }
        next = 0
    }
}
