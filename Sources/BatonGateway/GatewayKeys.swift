// What the gateway checks and resolves with keys the user configured: its group's beacon key
// (docs/security.md §4.4) and the IRKs of the user's own devices (§10). Made once at start,
// where a libcrypto failure can be reported, and handed to the loop.
public import BatonKeys

public struct GatewayKeys {
    /// Checks the keyed group's beacons; nil without `security.beacon-key`.
    public let verifier: BeaconVerifier?
    /// Resolves advertiser addresses to the devices of `apple.irks`; nil without any.
    public let addresses: AddressResolver?
    /// Per configured IRK, in file order: the id its entry is published under.
    public let appleIDs: [UInt32]
    /// Tags the beacons this gateway re-advertises (`relay.readvertise`, docs/relay.md §9).
    public let tagger: BeaconTagger?

    public static var none: GatewayKeys { GatewayKeys(verifier: nil, addresses: nil, appleIDs: []) }

    init(verifier: BeaconVerifier?, addresses: AddressResolver?, appleIDs: [UInt32], tagger: BeaconTagger? = nil) {
        self.verifier = verifier
        self.addresses = addresses
        self.appleIDs = appleIDs
        self.tagger = tagger
    }

    public static func make(_ config: GatewayConfig) throws(CryptoError) -> GatewayKeys {
        var verifier: BeaconVerifier? = nil
        if let key = config.security.beaconKey {
            verifier = try BeaconVerifier(key: key, identities: config.security.identities,
                                          policy: config.security.unkeyed, companyID: config.companyID)
        }
        var tagger: BeaconTagger? = nil
        if config.readvertise > 0, let key = config.security.beaconKey { tagger = try BeaconTagger(key: key) }
        guard !config.appleIRKs.isEmpty else {
            return GatewayKeys(verifier: verifier, addresses: nil, appleIDs: [], tagger: tagger)
        }
        var ids: [UInt32] = []
        for named in config.appleIRKs { ids.append(try named.irk.stableID()) }
        return GatewayKeys(verifier: verifier, addresses: try AddressResolver(irks: config.appleIRKs.map({ $0.irk })),
                           appleIDs: ids, tagger: tagger)
    }

    /// Whether these keys are the ones `config` asks for.
    func matches(_ config: GatewayConfig) -> Bool {
        (verifier != nil) == (config.security.beaconKey != nil) && appleIDs.count == config.appleIRKs.count
    }
}
