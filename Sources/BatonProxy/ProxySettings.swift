// What the config's `esphome:` section sets (docs/config.md, docs/esphome.md §6).
import BatonWire

public enum ProxyEncryption: Sendable, Equatable {
    /// Noise_NNpsk0 with this 32-byte pre-shared key (Home Assistant is given its base64).
    case noise(key: [UInt8])
    /// Plaintext: only when the config says `encryption: none`.
    case none
}

/// `esphome.scan-mode`: who decides between passive and active scanning.
public enum ProxyScanMode: Sendable, Equatable {
    /// Passive, active while Home Assistant asks (`BluetoothScannerSetModeRequest`).
    case onRequest
    /// Always passive: requests are answered with the state, and change nothing.
    case passive
    /// Always active.
    case active
}

public struct ProxySettings: Sendable, Equatable {
    /// Where the server listens. Home Assistant runs on another machine of the LAN, so the
    /// default is every IPv4 address; `127.0.0.1` keeps it to this machine.
    public var address: String = "0.0.0.0"
    /// ESPHome's API port; Home Assistant's ESPHome integration offers it by default.
    public var port: UInt16 = 6053
    public var encryption: ProxyEncryption
    /// Client slots: each Home Assistant (or aioesphomeapi tool) holds one. Fixed at start.
    public var clients: Int = 4
    /// A client whose send buffer has stayed full this long is disconnected: it stopped reading.
    public var stallTimeout: Duration = .seconds(10)
    /// A client that has sent nothing for `pingAfter` is sent a PingRequest; one that has still
    /// sent nothing (not even the PingResponse) after `idleTimeout` is disconnected: it is gone
    /// without a FIN. Home Assistant sends nothing while advertisements stream in (it pings
    /// only after 20 s of receiving nothing), so silence alone does not mean gone. ESPHome's
    /// own server does the same: 60 s, then 2.5 × that.
    public var pingAfter: Duration = .seconds(60)
    public var idleTimeout: Duration = .seconds(150)
    /// Per-client buffers, allocated at start. Home Assistant's messages are small; the send
    /// buffer holds several batches of 16 advertisements.
    public var receiveBuffer: Int = 1024
    public var sendBuffer: Int = 16 * 1024
    /// `DeviceInfoResponse.name`, the node name Home Assistant keys the device by; empty: the
    /// gateway id.
    public var name: String = ""
    /// `DeviceInfoResponse.friendly_name`; empty: the room.
    public var friendlyName: String = ""
    /// The avahi service file the gateway writes at start, so Home Assistant discovers it
    /// (docs/esphome.md §7); empty: none.
    public var mdnsServiceFile: String = ProxySettings.defaultServiceFile
    /// Where the package puts the avahi service file (docs/install.md).
    public static let defaultServiceFile = "/etc/avahi/services/baton-esphome.service"
    /// `DeviceInfoResponse.mac_address`, "AA:BB:CC:DD:EE:FF"; nil: derived at start.
    public var mac: String? = nil
    /// Who sets the scan type (docs/esphome.md "Active scanning").
    public var scanMode: ProxyScanMode = .onRequest
    /// `connections`: devices Home Assistant may be connected to through the gateway at once
    /// (0: none, and the scanner is not connectable), as an ESP32's
    /// `bluetooth_proxy.connection_slots` (default 3, at most 9).
    public var connections: Int = 3
    public static let connectionsRange = 0 ... 9

    public init(encryption: ProxyEncryption) { self.encryption = encryption }

    public static let defaultPort: UInt16 = 6053

    /// The 32-byte key from its base64 text (RFC 4648 §4, padding required: what
    /// `esphome` and Home Assistant print). Nil when it is not exactly that.
    public static func key(base64 text: String) -> [UInt8]? {
        let s = Array(text.utf8)
        guard s.count == 44, s[43] == UInt8(ascii: "="), s[42] != UInt8(ascii: "=") else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(33)
        var acc: UInt32 = 0, bits = 0
        for c in s[0..<43] {
            let v: UInt32
            switch c {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"): v = UInt32(c - UInt8(ascii: "A"))
            case UInt8(ascii: "a")...UInt8(ascii: "z"): v = UInt32(c - UInt8(ascii: "a")) + 26
            case UInt8(ascii: "0")...UInt8(ascii: "9"): v = UInt32(c - UInt8(ascii: "0")) + 52
            case UInt8(ascii: "+"): v = 62
            case UInt8(ascii: "/"): v = 63
            default: return nil
            }
            acc = acc << 6 | v
            bits += 6
            if bits >= 8 {
                bits -= 8
                out.append(UInt8(truncatingIfNeeded: acc >> UInt32(bits)))
            }
        }
        // 43 digits carry 258 bits: 32 bytes and 2 bits that must be zero (canonical).
        guard out.count == 32, acc & 0b11 == 0 else { return nil }
        return out
    }

    /// "AA:BB:CC:DD:EE:FF" from a 48-bit address, most significant byte first.
    public static func macText(_ address: UInt64) -> String {
        var s = ""
        for i in stride(from: 40, through: 0, by: -8) {
            let b = UInt8(truncatingIfNeeded: address >> UInt64(i))
            let digits: [Character] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "A", "B", "C", "D", "E", "F"]
            s.append(digits[Int(b >> 4)])
            s.append(digits[Int(b & 15)])
            if i > 0 { s.append(":") }
        }
        return s
    }

    /// A MAC written "AA:BB:CC:DD:EE:FF" (either case) as its 48-bit value; nil otherwise.
    public static func parseMAC(_ text: String) -> UInt64? {
        let parts = text.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 6 else { return nil }
        var v: UInt64 = 0
        for p in parts {
            guard p.utf8.count == 2, let b = UInt8(p, radix: 16) else { return nil }
            v = v << 8 | UInt64(b)
        }
        return v
    }

    /// The lower-case hex without colons that ESPHome's mDNS TXT `mac` and the Noise server
    /// hello carry ("aabbccddeeff").
    public static func compactMAC(_ address: UInt64) -> String {
        var s = ""
        for c in macText(address).utf8 where c != UInt8(ascii: ":") {
            let lower = c >= UInt8(ascii: "A") && c <= UInt8(ascii: "F") ? c + 32 : c
            s.append(Character(Unicode.Scalar(lower)))
        }
        return s
    }
}

/// Who the gateway says it is to Home Assistant: DeviceInfoResponse's fields, the MAC in both
/// forms, made once at start from the settings and the gateway's id and room.
public struct ProxyIdentity: Sendable, Equatable {
    public let info: DeviceInfo
    /// The 48-bit `mac_address`, most significant byte first.
    public let mac: UInt64
    /// The ESPHome release whose API this server follows, reported as `esphome_version`:
    /// Home Assistant shows it as the device's software version.
    public static let esphomeVersion = "2025.5.0"
    /// `project_name`: Home Assistant shows manufacturer "Baton", model "Baton gateway" (§3.2).
    public static let projectName = "Baton.Baton gateway"

    /// `name` and `friendlyName` default to the gateway id and the room; `mac` to
    /// `ProxySettings.derivedMAC(gatewayID:)`; `bluetoothAddress` (the controller's, when the
    /// gateway knows it) to the same MAC.
    public init(settings: ProxySettings, gatewayID: String, room: String, bluetoothAddress: UInt64? = nil,
                version: String = "") {
        let mac = settings.mac.flatMap(ProxySettings.parseMAC) ?? ProxySettings.derivedMAC(gatewayID: gatewayID)
        self.mac = mac
        let encrypted: Bool
        if case .noise = settings.encryption { encrypted = true } else { encrypted = false }
        info = DeviceInfo(name: settings.name.isEmpty ? gatewayID : settings.name, macAddress: ProxySettings.macText(mac),
                          esphomeVersion: Self.esphomeVersion, model: "Baton gateway", manufacturer: "Baton",
                          friendlyName: settings.friendlyName.isEmpty ? room : settings.friendlyName,
                          bluetoothMacAddress: ProxySettings.macText(bluetoothAddress ?? mac), encryptionSupported: encrypted,
                          projectName: Self.projectName, projectVersion: version)
    }

    public var compactMAC: String { ProxySettings.compactMAC(mac) }
    public var name: String { String(decoding: info.name, as: UTF8.self) }
    public var friendlyName: String { String(decoding: info.friendlyName, as: UTF8.self) }
}

extension ProxySettings {
    /// The MAC a gateway reports when `esphome.mac` is not set: locally administered and
    /// unicast (first byte 0x02), the other five bytes the low 40 bits of the 64-bit FNV-1a hash
    /// of "baton-esphome:" + the gateway id. Stable across restarts and reinstalls as long as
    /// the id stays, and different for every gateway of a building (their ids are).
    public static func derivedMAC(gatewayID: String) -> UInt64 {
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for b in ("baton-esphome:" + gatewayID).utf8 {
            h ^= UInt64(b)
            h = h &* 0x0000_0100_0000_01B3
        }
        return 0x02_00_0000_0000 | (h & 0xFF_FFFF_FFFF)
    }
}
