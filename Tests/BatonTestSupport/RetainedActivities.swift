// Retained activities in bulk, for the retained-flood tests (docs/broker.md "Retained floods").
import Foundation

/// `count` retained activities under `baton/activities/<device>`, each the size and shape of a
/// real one (docs/mqtt.md §2: ≈ 430 bytes), spread over 50 rooms; for
/// `MosquittoBroker.publishRetained(_:qos:)`.
public func retainedActivities(count: Int) -> [(topic: String, payload: [UInt8])] {
    (0 ..< count).map { i in
        let device = String(format: "%012llx", 0x5A00_0000_0000 + UInt64(i))
        let json = #"{"device":"\#(device)","state":"current","change":"saved","seq":259,"type_hash":"be9b4bb7","#
            + #""type":"com.example.reader.article","title":"Chapter 3","webpage_url":"https://example.com/book/3","#
            + #""payload_seq":259,"group":"a1b2c3d4","supports_streams":true,"has_web_url":true,"relayed":false,"#
            + #""psm":128,"verified":false,"room":"Room \#(i % 50)","gateway":"gw\#(i % 50)","rssi":-61,"#
            + #""first_seen":"2026-11-23T09:14:03.512204Z","changed":"2026-11-23T09:20:41.004318Z","moved_at":null}"#
        return ("baton/activities/\(device)", Array(json.utf8))
    }
}
