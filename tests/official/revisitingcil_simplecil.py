# Excerpt of SimpleCIL's and APER's official code, for the cross-check in tests/test_prototypes_pretrained.py.
# Repository: https://github.com/zhoudw-zdw/RevisitingCIL
# Commit: a2e6b71f6a2fed4421609a0917eea861fa387c76
# Paths: convs/linears.py (CosineLinear), utils/inc_net.py (SimpleVitNet, MultiBranchCosineIncrementalNet's update_fc,
#        generate_fc and forward, BaseNet's constructor), models/simplecil.py (Learner.replace_fc),
#        models/aper_adapter.py (Learner.replace_fc: the prototypes of the concatenated features)
# Licence: the repository states none at this commit (no LICENSE file); excerpt kept here only to test against.
import copy
import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


# ---- convs/linears.py ----
class CosineLinear(nn.Module):
    def __init__(self, in_features, out_features, nb_proxy=1, to_reduce=False, sigma=True):
        super(CosineLinear, self).__init__()
        self.in_features = in_features
        self.out_features = out_features * nb_proxy
        self.nb_proxy = nb_proxy
        self.to_reduce = to_reduce
        self.weight = nn.Parameter(torch.Tensor(self.out_features, in_features))
        if sigma:
            self.sigma = nn.Parameter(torch.Tensor(1))
        else:
            self.register_parameter('sigma', None)
        self.reset_parameters()

    def reset_parameters(self):
        stdv = 1. / math.sqrt(self.weight.size(1))
        self.weight.data.uniform_(-stdv, stdv)
        if self.sigma is not None:
            self.sigma.data.fill_(1)

    def forward(self, input):
        out = F.linear(F.normalize(input, p=2, dim=1), F.normalize(self.weight, p=2, dim=1))

        if self.to_reduce:
            # Reduce_proxy
            out = reduce_proxies(out, self.nb_proxy)

        if self.sigma is not None:
            out = self.sigma * out

        return {'logits': out}


# ---- utils/inc_net.py ----
class SimpleVitNet(nn.Module):  # cl-bench: BaseNet's constructor inlined, the backbone given
    def __init__(self, convnet, feature_dim):
        super().__init__()
        self.convnet = convnet
        self.fc = None
        self.feature_dim = feature_dim

    def update_fc(self, nb_classes, nextperiod_initialization=None):
        fc = self.generate_fc(self.feature_dim, nb_classes)  # cl-bench: .cuda() dropped
        if self.fc is not None:
            nb_output = self.fc.out_features
            weight = copy.deepcopy(self.fc.weight.data)
            fc.sigma.data = self.fc.sigma.data
            if nextperiod_initialization is not None:
                weight = torch.cat([weight, nextperiod_initialization])
            else:
                weight = torch.cat([weight, torch.zeros(nb_classes - nb_output, self.feature_dim)])  # cl-bench: .cuda() dropped
            fc.weight = nn.Parameter(weight)
        del self.fc
        self.fc = fc

    def generate_fc(self, in_dim, out_dim):
        fc = CosineLinear(in_dim, out_dim)
        return fc

    def extract_vector(self, x):
        return self.convnet(x)

    def forward(self, x):
        x = self.convnet(x)
        out = self.fc(x)
        # out.update(x)
        return out


class MultiBranchForward(nn.Module):  # cl-bench: MultiBranchCosineIncrementalNet's update_fc and forward
    def __init__(self, convnets, feature_dim):
        super().__init__()
        self.convnets = convnets  # [pretrained, adapted], as construct_dual_branch_network appends them
        self._feature_dim = feature_dim  # cl-bench: set by construct_dual_branch_network
        self.fc = None
        self.modeltype = 'vit'

    def update_fc(self, nb_classes, nextperiod_initialization=None):
        fc = self.generate_fc(self._feature_dim, nb_classes)  # cl-bench: .cuda() dropped
        if self.fc is not None:
            nb_output = self.fc.out_features
            weight = copy.deepcopy(self.fc.weight.data)
            fc.sigma.data = self.fc.sigma.data
            if nextperiod_initialization is not None:
                weight = torch.cat([weight, nextperiod_initialization])
            else:
                weight = torch.cat([weight, torch.zeros(nb_classes - nb_output, self._feature_dim)])  # cl-bench: .cuda() dropped
            fc.weight = nn.Parameter(weight)
        del self.fc
        self.fc = fc

    def generate_fc(self, in_dim, out_dim):
        fc = CosineLinear(in_dim, out_dim)
        return fc

    def forward(self, x):
        if self.modeltype=='cnn':
            features = [convnet(x)["features"] for convnet in self.convnets]
            features = torch.cat(features, 1)
            # import pdb; pdb.set_trace()
            out = self.fc(features)
            out.update({"features": features})
            return out
        else:
            features = [convnet(x) for convnet in self.convnets]
            features = torch.cat(features, 1)
            # import pdb; pdb.set_trace()
            out = self.fc(features)
            out.update({"features": features})
            return out


# ---- models/simplecil.py ----
class Learner:  # cl-bench: the attributes replace_fc reads
    def __init__(self, network):
        self._network = network

    def replace_fc(self,trainloader, model, args):
        model = model.eval()
        embedding_list = []
        label_list = []
        with torch.no_grad():
            for i, batch in enumerate(trainloader):
                (_,data,label)=batch
                data=data  # cl-bench: .cuda() dropped
                label=label  # cl-bench: .cuda() dropped
                embedding=model.convnet(data)
                embedding_list.append(embedding.cpu())
                label_list.append(label.cpu())
        embedding_list = torch.cat(embedding_list, dim=0)
        label_list = torch.cat(label_list, dim=0)

        class_list=np.unique(self.train_dataset.labels)
        proto_list = []
        for class_index in class_list:
            # print('Replacing...',class_index)
            data_index=(label_list==class_index).nonzero().squeeze(-1)
            embedding=embedding_list[data_index]
            proto=embedding.mean(0)
            self._network.fc.weight.data[class_index]=proto
        return model


# ---- models/aper_adapter.py ----
class AperLearner:  # cl-bench: the attributes replace_fc reads
    def __init__(self, network):
        self._network = network

    def replace_fc(self,trainloader, model, args):
        # replace fc.weight with the embedding average of train data
        model = model.eval()
        embedding_list = []
        label_list = []
        # data_list=[]
        with torch.no_grad():
            for i, batch in enumerate(trainloader):
                (_,data,label)=batch
                data=data  # cl-bench: .cuda() dropped
                label=label  # cl-bench: .cuda() dropped
                embedding = model(data)['features']
                embedding_list.append(embedding.cpu())
                label_list.append(label.cpu())
        embedding_list = torch.cat(embedding_list, dim=0)
        label_list = torch.cat(label_list, dim=0)

        class_list=np.unique(self.train_dataset.labels)
        proto_list = []
        for class_index in class_list:
            # print('Replacing...',class_index)
            data_index=(label_list==class_index).nonzero().squeeze(-1)
            embedding=embedding_list[data_index]
            proto=embedding.mean(0)
            self._network.fc.weight.data[class_index]=proto
        return model
