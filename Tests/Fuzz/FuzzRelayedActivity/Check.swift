// Fuzz target: what re-advertising reads from anyone on the broker (docs/relay.md §9): activity
// messages on `<prefix>/activities/+`, and answers on `<prefix>/answers/<gateway>/+`. The input
// is up to 8 messages separated by 0x00 bytes; each message's first byte picks one of 4 devices
// (low 2 bits), the rest is its payload. Every message goes to one `Readvertiser` of 2 slots and,
// as an answer, to `AnswerForPhone`.
// Invariants:
//   * a change names a slot, and leaves it held (`advertise`) or free (`withdraw`);
//   * a held slot is the keyed group's, owned by another gateway, at most once per device;
//   * its advertisement is 31 bytes that decode as a relayed v1 beacon with that slot's
//     device, sequence and PSM, whose tag verifies under the beacon key;
//   * an answer's correlation is at most half its hex, and only `ok` carries a payload;
//   * `RetainedEntry.gateway` (the orphan scan's and the owner's reader, docs/rooms.md §7)
//     names a gateway only when the message holds it as a quoted string, never an empty one
//     that was not written empty, and never one with a backslash.
import BatonGateway
import BatonKeys
import BatonMQTT
import BatonWire
import FuzzSupport

let keys = try! GroupKeys.derive(secret: try! GroupSecret(text: "BATON-GROUP-V1:AAAQEAYEAUDAOCAJBIFQYDIOB4QL"))
nonisolated(unsafe) let tagger = try! BeaconTagger(key: keys.beaconKey)
let devices: [UInt64] = [0x7CEC_7226_0004, 0x7CEC_7226_0005, 0x5A00_0000_0001, 0]

func check(_ bytes: UnsafeRawBufferPointer) {
    var r = Readvertiser(groupHash: keys.groupHash, selfID: "office", psms: [0x0091, 0x0092])
    for message in bytes.split(separator: 0, maxSplits: 7, omittingEmptySubsequences: false) {
        let device = devices[Int((message.first ?? 0) & 3)]
        let payload = Array(message.dropFirst())
        if let change = r.activity(device: device, payload: payload) {
            switch change {
            case .advertise(let k): invariant(r.slots.indices.contains(k) && r.slots[k] != nil, "advertise(\(k)) of a free slot")
            case .withdraw(let k): invariant(r.slots.indices.contains(k) && r.slots[k] == nil, "withdraw(\(k)) of a held slot")
            }
        }
        var seen: Set<UInt64> = []
        for k in r.slots.indices {
            guard let a = r.slots[k] else { continue }
            invariant(seen.insert(a.device).inserted, "device \(a.device) in two slots")
            invariant(a.owner != "office", "this gateway's own activity on the air")
            let advert = r.advertisement(k, companyID: 0xFFFF, tagger: tagger)
            invariant(advert.count == ActivityBeacon.advertisementLength, "advertisement of \(advert.count) bytes")
            let beacon: ActivityBeacon? = advert.withUnsafeBytes { try? ActivityBeacon.find(inAdvertisingData: $0, companyID: 0xFFFF) }
            guard let beacon else { invariant(false, "slot \(k)'s advertisement does not decode"); return }
            invariant(beacon.flags.contains(.relayed) && !beacon.flags.contains(.invalidated), "flags \(beacon.flags)")
            invariant(beacon.deviceID == a.device && beacon.sequence == a.sequence && beacon.psm == r.psms[k]
                      && beacon.groupHash == keys.groupHash, "slot \(k) goes out as \(beacon)")
            invariant(beacon.verify(companyID: 0xFFFF, authenticator: tagger), "slot \(k)'s tag does not verify")
        }
        if let g = payload.withUnsafeBytes({ RetainedEntry.gateway($0) }) {
            let quoted = Array("\"\(g)\"".utf8)
            invariant(!g.utf8.contains(UInt8(ascii: "\\")), "a gateway with an escape: \(g)")
            invariant(payload.count >= quoted.count
                      && (0...(payload.count - quoted.count)).contains { payload[$0..<$0 + quoted.count].elementsEqual(quoted) },
                      "gateway \(g) is not written in the message")
        }
        let answer = AnswerForPhone(MQTTMessage(topic: "baton/answers/office/1", payload: payload, qos: 1, retained: false))
        invariant(answer.correlation.count * 2 <= payload.count, "a correlation longer than the message")
        invariant(answer.payload.isEmpty || answer.status == "ok", "a payload with status \(answer.status)")
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    check(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}
