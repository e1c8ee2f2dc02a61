// Home Assistant MQTT discovery (docs/mqtt.md §4). Home Assistant reads
// `<discovery prefix>/<component>/<node id>/<object id>/config`; node and object ids are
// [a-zA-Z0-9_-]. Each payload names its state topic, a unique_id, the device block that
// groups entities into one device. A tracked device's configs are the same whichever room
// publishes it, so they are sent once (docs/mqtt.md §4 "Once"); a named Apple device's Room
// entity is available while its publishing gateway's status is `online`. An empty retained
// message on a config topic removes the entity.
public import BatonRelay
public import BatonWire

public enum Discovery {
    public static let manufacturer: StaticString = "Baton"

    /// The gateway as a Home Assistant device with one connectivity entity.
    public static func gatewayConnectivity(topics: Topics, room: String, version: String,
                                           into w: inout JSONWriter) throws(WireError) {
        try w.beginObject()
        try w.key("name"); try w.string("Connectivity")
        try w.key("unique_id"); try w.string("\(topics.gatewayNode)_connectivity")
        try w.key("device_class"); try w.string("connectivity")
        try w.key("entity_category"); try w.string("diagnostic")
        try w.key("state_topic"); try w.string(topics.status)
        try w.key("payload_on"); try w.string("online")
        try w.key("payload_off"); try w.string("offline")
        // The counters beside the status become the entity's attributes.
        try w.key("json_attributes_topic"); try w.string(topics.stats)
        try w.key("device"); try w.beginObject()
        try w.key("identifiers"); try w.beginArray(); try w.string(topics.gatewayNode); try w.endArray()
        try w.key("name"); try w.string("Baton \(room)")
        try w.key("manufacturer"); try w.string(manufacturer)
        try w.key("model"); try w.string("Baton gateway")
        try w.key("sw_version"); try w.string(version)
        try w.key("suggested_area"); try w.string(room)
        try w.endObject()
        try origin(version: version, into: &w)
        try w.endObject()
    }

    public enum DeviceEntity: Sendable { case room, activity }

    /// One entity of a tracked device: its room, or its current activity (type hash as the
    /// state, the whole activity JSON as attributes: seq, flags, web URL flag, first seen).
    public static func deviceEntity(_ entity: DeviceEntity, deviceID: UInt64, topics: Topics, version: String,
                                    into w: inout JSONWriter) throws(WireError) {
        let node = Topics.deviceNode(deviceID)
        let text = Topics.deviceText(deviceID)
        try w.beginObject()
        switch entity {
        case .room:
            try w.key("name"); try w.string("Room")
            try w.key("unique_id"); try w.string("\(node)_room")
            try w.key("icon"); try w.string("mdi:map-marker")
            // An empty retained message (the activity ended) is not JSON: say "unknown"
            // instead of making Home Assistant log a template error.
            try w.key("value_template"); try w.string("{{ value_json.room if value_json is defined else None }}")
        case .activity:
            try w.key("name"); try w.string("Activity")
            try w.key("unique_id"); try w.string("\(node)_activity")
            try w.key("icon"); try w.string("mdi:gesture-swipe-horizontal")
            // The title when the payload named one, else the type's name, else its hash
            // (docs/mqtt.md §4); 255 characters is the most a state may hold.
            try w.key("value_template")
            try w.string("{{ (value_json.title or value_json.type or value_json.type_hash)[:255] if value_json is defined else None }}")
            try w.key("json_attributes_topic"); try w.string(topics.activity(deviceID))
        }
        // No availability and no `via_device`: both would name the room that publishes, and
        // the configs would change (be sent again) at every move. A device nobody publishes has
        // an empty activity topic, which the templates read as "unknown" (docs/mqtt.md §4).
        try w.key("state_topic"); try w.string(topics.activity(deviceID))
        try w.key("device"); try w.beginObject()
        try w.key("identifiers"); try w.beginArray(); try w.string(node); try w.endArray()
        try w.key("name"); try w.string("Baton device \(text)")
        try w.key("manufacturer"); try w.string(manufacturer)
        try w.key("model"); try w.string("Activity beacon")
        try w.endObject()
        try origin(version: version, into: &w)
        try w.endObject()
    }

    /// Where a device is, for a person to follow (docs/mqtt.md §4): an MQTT device tracker whose
    /// state topic holds the room as plain text, or `not_home` once the device has expired.
    /// No availability: a tracker says `not_home` after its gateway is gone (the first online
    /// gateway writes it, docs/rooms.md §4), where a sensor would read "unavailable". No name:
    /// the entity takes the device's, as a person's trackers usually do.
    public static func tracker(deviceID: UInt64?, appleID: UInt32?, name: String?, topics: Topics, version: String,
                               into w: inout JSONWriter) throws(WireError) {
        let node: String, state: String
        if let deviceID {
            node = Topics.deviceNode(deviceID); state = topics.tracker(deviceID)
        } else {
            let id = appleID ?? 0
            node = Topics.personNode(id); state = topics.tracker(apple: id)
        }
        try w.beginObject()
        try w.key("name"); try w.null()
        try w.key("unique_id"); try w.string("\(node)_tracker")
        try w.key("state_topic"); try w.string(state)
        try w.key("source_type"); try w.string("bluetooth_le")
        try w.key("payload_not_home"); try w.string("not_home")
        try w.key("device"); try w.beginObject()
        try w.key("identifiers"); try w.beginArray(); try w.string(node); try w.endArray()
        if let deviceID {
            try w.key("name"); try w.string("Baton device \(Topics.deviceText(deviceID))")
            try w.key("model"); try w.string("Activity beacon")
        } else {
            try w.key("name"); try w.string(name ?? node)
            try w.key("model"); try w.string("Phone or watch, by its IRK")
        }
        try w.key("manufacturer"); try w.string(manufacturer)
        try w.endObject()
        try origin(version: version, into: &w)
        try w.endObject()
    }

    /// A device the user named by its IRK (docs/security.md §10): the room it is in, as the
    /// room that owns it says; the whole Apple entry as attributes. One device per name, so a
    /// person shows in Home Assistant as "Anna's iPhone: Room Kitchen", available while the
    /// publishing gateway is online.
    public static func personRoom(name: String, appleID: UInt32, topics: Topics, version: String,
                                  into w: inout JSONWriter) throws(WireError) {
        let node = Topics.personNode(appleID)
        try w.beginObject()
        try w.key("name"); try w.string("Room")
        try w.key("unique_id"); try w.string("\(node)_room")
        try w.key("icon"); try w.string("mdi:map-marker-account")
        try w.key("value_template"); try w.string("{{ value_json.room if value_json is defined else None }}")
        try w.key("state_topic"); try w.string(topics.apple(appleID))
        try w.key("json_attributes_topic"); try w.string(topics.apple(appleID))
        try availability(topics, into: &w)
        try w.key("device"); try w.beginObject()
        try w.key("identifiers"); try w.beginArray(); try w.string(node); try w.endArray()
        try w.key("name"); try w.string(name)
        try w.key("manufacturer"); try w.string(manufacturer)
        try w.key("model"); try w.string("Phone or watch, by its IRK")
        try w.key("via_device"); try w.string(topics.gatewayNode)
        try w.endObject()
        try origin(version: version, into: &w)
        try w.endObject()
    }

    /// Available while this gateway's status topic says `online`: its entities go
    /// "unavailable" with it.
    static func availability(_ topics: Topics, into w: inout JSONWriter) throws(WireError) {
        try w.key("availability"); try w.beginArray()
        try w.beginObject()
        try w.key("topic"); try w.string(topics.status)
        try w.key("payload_available"); try w.string("online")
        try w.key("payload_not_available"); try w.string("offline")
        try w.endObject()
        try w.endArray()
    }

    static func origin(version: String, into w: inout JSONWriter) throws(WireError) {
        try w.key("origin"); try w.beginObject()
        try w.key("name"); try w.string("Baton")
        try w.key("sw_version"); try w.string(version)
        try w.endObject()
    }
}
