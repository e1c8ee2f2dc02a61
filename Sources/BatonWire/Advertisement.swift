// What one advertisement carries, found in a single walk over its AD structures
// (docs/protocol.md §1): an activity beacon under the configured company id, Apple
// Continuity messages under 0x004C, and the common AD fields a user would recognise.
// Everything is borrowed from the report; nothing is allocated.

public struct AdvertisementContent {
    /// Number of AD structures in the significant part.
    public var structures = 0
    /// The Flags AD's first byte (Core Supplement, Part A, §1.3).
    public var flags: UInt8?
    /// TX Power Level AD, dBm.
    public var txPower: Int8?
    /// Complete or shortened local name, UTF-8 as sent (not validated).
    public var localName: UnsafeRawBufferPointer?
    /// The company id of the first manufacturer-specific AD.
    public var companyID: UInt16?
    /// The activity beacon, when a manufacturer AD carries the configured company id.
    public var beacon: ActivityBeacon?
    /// The bytes `beacon` was decoded from (its 24-byte value, right after the company id):
    /// what its tag must be checked over, so a second beacon record in the same advertisement
    /// cannot lend its tag to the one decoded (docs/security.md §4.3).
    public var beaconValue: UnsafeRawBufferPointer?
    /// The Apple manufacturer value (after 0x004C), its TLV chain already validated:
    /// iterate it with `continuityMessages`.
    public var apple: UnsafeRawBufferPointer?

    public init() {}

    public enum Kind: Sendable { case beacon, continuity, other }

    /// Beacon first: a device that sends both is a Baton device.
    @inlinable
    public var kind: Kind { beacon != nil ? .beacon : apple != nil ? .continuity : .other }

    /// The Continuity TLVs; empty when there is no Apple data. Costs nothing: `decode`
    /// validated the chain once, and `apple` is set only when it did.
    @inlinable
    public var continuityMessages: ContinuityIterator {
        guard let apple else { return .empty }
        return ContinuityIterator(reader: ByteReader(apple))
    }

    /// Walks the advertising data once. A malformed AD chain, beacon or Continuity chain
    /// throws: the report is dropped and counted under the error's reason.
    // Inlined into the caller so the ~100-byte result is built in place: returned from a call
    // it was written field by field and read back whole (a store-forwarding stall), which was
    // a third of AdvertisementDecoder's time in scripts/bench.
    @inlinable @inline(__always)
    public static func decode(_ data: UnsafeRawBufferPointer,
                              beaconCompanyID: UInt16 = ActivityBeacon.defaultCompanyID) throws(WireError) -> AdvertisementContent {
        var c = AdvertisementContent()
        var it = ADIterator(data)
        while let ad = try it.next() {
            c.structures &+= 1
            switch ad.type {
            case ADType.flags where ad.data.count >= 1:
                c.flags = ad.data[0]
            case ADType.txPowerLevel where ad.data.count >= 1:
                c.txPower = Int8(bitPattern: ad.data[0])
            case ADType.completeLocalName, ADType.shortenedLocalName:
                if c.localName == nil || ad.type == ADType.completeLocalName { c.localName = ad.data }
            case ADType.manufacturerSpecificData:
                guard let m = ad.manufacturer else { continue }
                if c.companyID == nil { c.companyID = m.companyID }
                // Offset of the value in `data`: length, type, company id.
                let valueAt = ad.offset &+ 4
                if m.companyID == beaconCompanyID {
                    do throws(WireError) { c.beacon = try ActivityBeacon.decode(value: m.value) } catch { throw error.shifted(by: valueAt) }
                    c.beaconValue = m.value
                } else if m.companyID == appleCompanyID {
                    do throws(WireError) { _ = try ContinuityIterator(validating: m.value) } catch { throw error.shifted(by: valueAt) }
                    c.apple = m.value
                }
            default:
                continue
            }
        }
        return c
    }
}

extension ContinuityIterator {
    /// An iterator with nothing in it.
    public static var empty: ContinuityIterator { ContinuityIterator(reader: ByteReader(UnsafeRawBufferPointer(start: nil, count: 0))) }

    @usableFromInline init(reader: ByteReader) { self.reader = reader }
}
