public enum BatonHCI {}
