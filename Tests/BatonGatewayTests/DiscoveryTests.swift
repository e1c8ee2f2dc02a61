// Home Assistant MQTT discovery (docs/mqtt.md §4), checked the way Home Assistant's MQTT
// integration reads a config payload (homeassistant/components/mqtt: discovery.py matches the
// topic, then the platform schema validates the payload):
// - topic `<prefix>/<component>/[<node_id>/]<object_id>/config`, ids matching [a-zA-Z0-9_-]+;
// - the payload is a JSON object; keys are the platform's (abbreviations expanded);
// - `state_topic` is required for sensor and binary_sensor and must be a valid topic (no
//   wildcards); `unique_id` must be unique across all entities, or the second is ignored;
// - `device` needs `identifiers` or `connections` for a device registry entry;
// - `availability` is a list of objects with `topic`; availability_mode defaults to latest;
// - `json_attributes_topic`, when present, is a valid topic;
// - a device's `via_device` names another device's identifier;
// - device_tracker (mqtt/device_tracker.py, 2024.3): `state_topic` required, `source_type` one
//   of gps/router/bluetooth/bluetooth_le, `payload_home`/`payload_not_home`/`payload_reset`;
//   the location is the state topic's *raw* payload (not the value template), so the topic
//   must hold the room as plain text.
import BatonTestSupport
import Foundation
import Testing

struct DiscoveryTests {
    nonisolated(unsafe) static let idPattern = try! Regex("^[a-zA-Z0-9_-]+$")
    static let components: [String: Set<String>] = [
        // Keys Home Assistant's schemas accept for what Baton publishes (PLATFORM_SCHEMA of
        // sensor.py / binary_sensor.py plus the shared MQTT entity and availability schemas).
        "sensor": ["name", "unique_id", "icon", "value_template", "state_topic", "json_attributes_topic",
                   "availability", "device", "origin", "entity_category", "device_class", "unit_of_measurement"],
        "binary_sensor": ["name", "unique_id", "icon", "value_template", "state_topic", "json_attributes_topic",
                          "availability", "device", "origin", "entity_category", "device_class", "payload_on", "payload_off"],
        "device_tracker": ["name", "unique_id", "icon", "value_template", "state_topic", "json_attributes_topic",
                           "availability", "device", "origin", "source_type", "payload_home", "payload_not_home",
                           "payload_reset"],
    ]

    @Test func everyDiscoveryPayloadIsOneHomeAssistantAccepts() throws {
        let (broker, capture, gateway) = try hallReplaying("discovery", devices: 30, reports: 2_000, seed: 21)
        defer { gateway.kill() }
        // One gateway entity plus three per tracked device (room, activity, tracker).
        let expected = 1 + 3 * capture.lastBeacons.count
        let configs = try #require(try broker.retained("homeassistant/#", within: 15) { $0.count == expected },
                                   "discovery never complete: \(gateway.log)")

        var uniqueIDs = Set<String>()
        var deviceIdentifiers = Set<String>()
        var viaDevices = Set<String>()
        for (topic, payload) in configs {
            let parts = topic.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
            try #require(parts.count == 5 && parts[0] == "homeassistant" && parts[4] == "config", "topic \(topic)")
            let component = parts[1]
            let allowed = try #require(Self.components[component], "component \(component)")
            #expect(parts[2].wholeMatch(of: Self.idPattern) != nil, "node id in \(topic)")
            #expect(parts[3].wholeMatch(of: Self.idPattern) != nil, "object id in \(topic)")
            let o = try #require(json(payload), "payload of \(topic) is a JSON object")
            #expect(Set(o.keys).isSubset(of: allowed), "unknown keys in \(topic): \(Set(o.keys).subtracting(allowed))")
            let state = try #require(o["state_topic"] as? String, "state_topic in \(topic)")
            #expect(!state.contains("+") && !state.contains("#") && !state.isEmpty)
            if let attributes = o["json_attributes_topic"] as? String { #expect(!attributes.contains("+") && !attributes.contains("#")) }
            let unique = try #require(o["unique_id"] as? String)
            #expect(uniqueIDs.insert(unique).inserted, "unique_id \(unique) used twice")
            let availability = o["availability"] as? [[String: Any]] ?? []
            if component == "sensor" {
                // The same config from every room (docs/mqtt.md §4 "Once"): no gateway named.
                #expect(availability.isEmpty && (o["device"] as? [String: Any])?["via_device"] == nil)
            } else if component == "device_tracker" {
                // No availability: it reads not_home after its gateway is gone (docs/mqtt.md §4).
                #expect(availability.isEmpty)
                #expect(o["source_type"] as? String == "bluetooth_le")
                #expect(o["payload_not_home"] as? String == "not_home")
                #expect(text(try broker.retained(state)[state]) == "Hall", "the tracker's topic holds the room as text")
            } else {
                #expect(o["device_class"] as? String == "connectivity")
                #expect(state == "baton/gateways/hall/status")
                #expect(o["payload_on"] as? String == "online" && o["payload_off"] as? String == "offline")
            }
            let device = try #require(o["device"] as? [String: Any], "device block in \(topic)")
            let identifiers = try #require(device["identifiers"] as? [String], "device identifiers in \(topic)")
            #expect(!identifiers.isEmpty)
            deviceIdentifiers.formUnion(identifiers)
            #expect(device["name"] as? String != nil)
            if let via = device["via_device"] as? String { viaDevices.insert(via) }
            #expect((o["origin"] as? [String: Any])?["name"] as? String == "Baton")
            // The state topic the entity reads holds what its template expects.
            if component == "sensor" {
                let stateJSON = try #require(json(try broker.retained(state)[state] ?? []), "state of \(topic)")
                #expect(stateJSON["room"] as? String == "Hall")
            }
        }
        #expect(viaDevices.isSubset(of: deviceIdentifiers), "via_device names a device that exists")
        #expect(uniqueIDs.count == expected)
    }
}
