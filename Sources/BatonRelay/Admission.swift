// Whether this gateway takes a fetch or a stream open (docs/relay.md §4, "Admission"). One
// decision for both, in two steps:
//
//   1. The request: `Admission.check`, from what the gateway knows of the device (the
//      ownership rule and the activity table, facts this module is handed): the topic's device
//      id, the body, the owner, the current activity, its link and, for a stream, its flag.
//   2. The room: `FetchRelay.fetch` and `StreamRelay.open` ask `Admission.room`: a device link
//      at all (`relay.link`), and a free slot (`relay.fetches`, `relay.streams`).
//
// Either step refuses with a `Refusal`, which says the fetch answer's status, the stream's
// error reason and the one detail text a user reads, whichever kind of request it was.

import BatonWire

/// What a request asks the device for.
public enum RequestKind: Sendable, Equatable {
    case fetch, stream
}

/// Why this gateway does not take a request it answers (docs/relay.md §4).
public enum Refusal: Error, Sendable, Equatable, CustomStringConvertible {
    /// The topic's device level is not a device id.
    case badTopic
    /// The fetch request's body is malformed (streams have no body: their open frame is the
    /// stream relay's to read).
    case badBody(WireError)
    /// The device is heard but nobody owns it this moment: it just arrived or its gateway went
    /// offline.
    case settling
    /// No gateway of the building hears the device.
    case unknownDevice
    /// The device is heard, but has no current activity.
    case noActivity
    /// The activity does not offer continuation streams (its beacon's flag).
    case noStreams
    /// The beacon names PSM 0: the device offers no link.
    case deviceHasNoLink
    /// This gateway has no device link (`relay.link: none`).
    case gatewayHasNoLink
    /// Every slot is taken: `capacity` fetches wait, or `capacity` streams are open.
    case full(RequestKind, capacity: Int)

    /// The fetch answer's status (docs/relay.md §3).
    public var fetchStatus: FetchStatus {
        switch self {
        case .badTopic, .badBody: .badRequest
        case .settling: .notOwner
        case .unknownDevice, .noActivity: .unknownDevice
        case .noStreams, .deviceHasNoLink, .gatewayHasNoLink: .unreachable
        case .full: .busy
        }
    }

    /// The stream error frame's reason (docs/relay.md §7.2): busy when full, unreachable else.
    public var streamReason: StreamReason {
        if case .full = self { return .busy }
        return .unreachable
    }

    /// The detail, the same words for a fetch and a stream.
    public var description: String {
        switch self {
        case .badTopic: "the topic's device level must be a device id: 12 lowercase hex digits"
        case .badBody(let error): "the request body: \(error)"
        case .settling:
            "no gateway owns this device at the moment (it just arrived, or its gateway went offline); ask again in a second"
        case .unknownDevice: "no gateway of this building hears this device"
        case .noActivity: "the device has no current activity"
        case .noStreams: "the activity does not offer continuation streams"
        case .deviceHasNoLink: "the device offers no link (PSM 0 in its beacon)"
        case .gatewayHasNoLink: "this gateway has no device link (relay.link)"
        case .full(.fetch, let capacity): "\(capacity) fetches are waiting (relay.fetches)"
        case .full(.stream, let capacity): "\(capacity) streams are open (relay.streams)"
        }
    }
}

/// What the gateway's activity table holds for a device: where its link is, what it offers.
public struct AdmittedActivity: Sendable, Equatable {
    public var address: UInt64
    public var addressType: UInt8
    public var psm: UInt16
    /// The sequence of the beacon last heard.
    public var sequence: UInt16
    public var supportsStreams: Bool
    public init(address: UInt64, addressType: UInt8, psm: UInt16, sequence: UInt16, supportsStreams: Bool) {
        self.address = address; self.addressType = addressType; self.psm = psm; self.sequence = sequence
        self.supportsStreams = supportsStreams
    }
}

public enum Admission {
    /// The request step, for the gateway that answers the request (docs/relay.md §4): the
    /// device's target, or why not, checked in this order: the topic, the body, the owner, the
    /// activity, its streams flag (streams only), its link.
    ///
    /// `device`: the topic's device id, nil when it is not one. `owns`: this gateway owns the
    /// device; `follows`: some gateway hears it (it is in the ownership table). `activity`: the
    /// device's current activity, nil when it has none.
    public static func check(_ kind: RequestKind, device: UInt64?, bodyError: WireError? = nil, owns: Bool,
                             follows: Bool, activity: AdmittedActivity?) -> Result<FetchTarget, Refusal> {
        guard let device else { return .failure(.badTopic) }
        if let bodyError { return .failure(.badBody(bodyError)) }
        guard owns else { return .failure(follows ? .settling : .unknownDevice) }
        guard let activity else { return .failure(.noActivity) }
        if kind == .stream, !activity.supportsStreams { return .failure(.noStreams) }
        guard activity.psm != 0 else { return .failure(.deviceHasNoLink) }
        return .success(FetchTarget(device: device, sequence: activity.sequence,
                                    link: LinkAddress(address: activity.address, addressType: activity.addressType,
                                                      psm: activity.psm)))
    }

    /// The room step, asked by the relays: a device link, then a free slot of `capacity`.
    static func room(_ kind: RequestKind, hasLink: Bool, free: Bool, capacity: Int) -> Refusal? {
        guard hasLink else { return .gatewayHasNoLink }
        guard free else { return .full(kind, capacity: capacity) }
        return nil
    }
}
