// Who speaks for a device this gateway's rule does not follow (docs/relay.md §4 "Who
// answers"). With neighbourhoods (docs/rooms.md §8.3) a gateway receives only the sightings of
// the rooms around it, so its rule knows nothing of a device at the far end of the building:
// neither that it has an owner nor who. Every gateway still reads every device's activity
// topic (docs/mqtt.md §2), and each message there names the gateway that published it, the
// owner. This remembers that name per device, so the gateway whose id sorts first, which
// answers requests about devices without an online owner, leaves a far device's requests to
// its owner instead of answering `unknown-device` beside it.

/// The gateway that last published each device's activity, as read off the activity topics:
/// an empty (cleared) message forgets the device. Fixed storage, taken at start; a message
/// about a new device when all `capacity` are held is not remembered, and counted.
public struct ActivityPublishers: ~Copyable {
    private var index: SlotIndex
    public let capacity: Int
    /// Messages about a device not remembered because `capacity` devices were held.
    public private(set) var full = 0

    /// `capacity`: 1...2 × the activity table's maximum (the config loader checks).
    public init(capacity: Int) {
        self.capacity = capacity
        index = SlotIndex(maxKeys: capacity)
    }

    /// Devices remembered.
    public var count: Int { index.count }

    /// A message on `device`'s activity topic: published by `gateway`, or cleared (nil; also a
    /// message naming a gateway this one has not registered, so an unknown name never hides
    /// the device from the rule's fallback answerer).
    public mutating func published(_ device: UInt64, by gateway: GatewaySlot?) {
        guard let gateway else { return index.remove(device) }
        if index.find(device) == nil && index.count >= capacity {
            full &+= 1
            return
        }
        index.insert(device, slot: Int32(truncatingIfNeeded: gateway.index))
    }

    /// Everything forgotten: this gateway (re)connected, and the broker may have restarted
    /// with nothing retained; the retained scan that follows tells it all again.
    public mutating func removeAll() { index.removeAll() }

    /// The gateway whose activity message `device` shows now, if any.
    public func publisher(of device: UInt64) -> GatewaySlot? {
        index.find(device).map { GatewaySlot(index: Int($0)) }
    }
}
